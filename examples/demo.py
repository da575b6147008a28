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
print("killed it")

print()
print("and the code interpreter (e2b-code-interpreter SDK, template code-interpreter-v1):")
from e2b_code_interpreter import Sandbox as CodeSandbox  # noqa: E402

ci = CodeSandbox.create()
ci.run_code("import pandas as pd\ndf = pd.DataFrame({'city': ['Oslo', 'Lima'], 'temp': [4, 19]})")
print("run_code  ->", ci.run_code("float(df['temp'].mean())").text)
chart = ci.run_code("import matplotlib.pyplot as plt\nplt.bar(df['city'], df['temp'])\nplt.title('Temperature')")
print("a chart   ->", [r.formats() for r in chart.results])
ci.kill()
print("the server keeps running for your own code")
