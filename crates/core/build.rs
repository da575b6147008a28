// The migration set is embedded at compile time (store/migrations.rs); a new file in it must
// rebuild the crate, which refinery's macro alone notices only for files it already knew.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
