//! Gives the wasm guest a 256 KiB stack instead of Rust's default 1 MiB.
//!
//! The stack sits at the bottom of linear memory, and the host resets a pooled instance's memory
//! after every request: a smaller memory is less to reset. The guest's deepest recursion is the
//! naive Fibonacci (depth 35) and serde_json's nesting limit (128), far below 256 KiB.

fn main() {
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("wasm32") {
        println!("cargo:rustc-link-arg=-zstack-size=262144");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
