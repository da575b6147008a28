"""A short tour of Airlock through the unmodified e2b SDK (run by ./run.sh)."""

from e2b import Sandbox

sbx = Sandbox.create(metadata={"demo": "yes"})
print(f"created sandbox {sbx.sandbox_id}")
print("uname -a  ->", sbx.commands.run("uname -a").stdout.strip())
print("whoami    ->", sbx.commands.run("whoami").stdout.strip())
sbx.files.write("hello.py", "print('hello from inside the sandbox')\n")
print("python3   ->", sbx.commands.run("python3 hello.py").stdout.strip())
print("files     ->", [e.name for e in sbx.files.list("/home/user")])
sbx.kill()
print("killed it; the server keeps running for your own code")
