//! Where this workspace's build leaves things: the guest components `make build` produces, and
//! the directory of compiled components.

use std::path::{Path, PathBuf};

/// `target/guest-cache` under the workspace root this host was built in.
pub fn default_cache_dir() -> PathBuf {
    workspace_root().join("target/guest-cache")
}

/// The workspace this host was built in.
fn workspace_root() -> &'static Path {
    let host_crate = Path::new(env!("CARGO_MANIFEST_DIR"));
    host_crate.parent().unwrap_or(host_crate)
}

/// Where `make build` leaves the component of the workspace crate `crate_name` (`guest`, or a
/// fixture's): `target/wasm32-wasip2/release/`, under the workspace root this host was built in.
/// A library component is named with underscores, a binary one (a command) as its crate is.
/// The one place the start-up default, the tests and the benchmarks find built guests.
pub fn built_component(crate_name: &str) -> PathBuf {
    let dir = workspace_root().join("target/wasm32-wasip2/release");
    let library = dir.join(format!("{}.wasm", crate_name.replace('-', "_")));
    if library.exists() {
        return library;
    }
    let binary = dir.join(format!("{crate_name}.wasm"));
    if binary.exists() { binary } else { library }
}
