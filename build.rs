fn main() {
    // The migrations are embedded at compile time: a new file must rebuild.
    println!("cargo:rerun-if-changed=migrations");
}
