//! Compiled components on disk, so starting or reloading a guest compiled before is near-instant.
//!
//! An entry is keyed by the SHA-256 of the component's bytes and by the engine's compatibility
//! hash (wasmtime version, compiler settings, CPU features), so an entry made by another engine
//! is never looked up. An entry ends with the SHA-256 of its contents, checked before wasmtime
//! sees it: a truncated or altered entry is a miss, recompiled and rewritten, never loaded.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// Whether a component came from the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Loaded from a verified entry: no compilation.
    Hit,
    /// Compiled; the entry was written for next time (if the directory is writable).
    Miss,
}

impl CacheOutcome {
    /// `hit` or `miss`, for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheOutcome::Hit => "hit",
            CacheOutcome::Miss => "miss",
        }
    }
}

/// A directory of compiled components.
#[derive(Debug, Clone)]
pub struct ComponentCache {
    dir: PathBuf,
}

const CHECKSUM_LEN: usize = 32;

impl ComponentCache {
    /// A cache in `dir`, created when first written.
    pub fn new(dir: impl Into<PathBuf>) -> ComponentCache {
        ComponentCache { dir: dir.into() }
    }

    /// The component for `bytes`: from a verified entry when there is one, else compiled (and
    /// the entry written; a failure to write only costs the next start its speed).
    pub fn load_or_compile(
        &self,
        engine: &Engine,
        bytes: &[u8],
    ) -> wasmtime::Result<(Component, CacheOutcome)> {
        let entry = self.entry_path(engine, bytes);
        if let Some(serialized) = read_verified(&entry) {
            // SAFETY: the entry was written by `store` below for an engine with this very
            // compatibility hash (it is part of the key), and its checksum matched, so these are
            // the bytes `Component::serialize` produced. wasmtime checks its own header as well.
            if let Ok(component) = unsafe { Component::deserialize(engine, &serialized) } {
                return Ok((component, CacheOutcome::Hit));
            }
        }
        let component = Component::new(engine, bytes)?;
        if let Err(error) = self.store(&entry, &component.serialize()?) {
            tracing::warn!(path = %entry.display(), %error, "cannot write the compiled-component cache");
        }
        Ok((component, CacheOutcome::Miss))
    }

    fn entry_path(&self, engine: &Engine, bytes: &[u8]) -> PathBuf {
        let mut engine_hash = DefaultHasher::new();
        engine
            .precompile_compatibility_hash()
            .hash(&mut engine_hash);
        let name = format!(
            "{}-{:016x}.cwasm",
            hex(&Sha256::digest(bytes)),
            engine_hash.finish()
        );
        self.dir.join(name)
    }

    fn store(&self, entry: &Path, serialized: &[u8]) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let mut contents = Vec::with_capacity(serialized.len() + CHECKSUM_LEN);
        contents.extend_from_slice(serialized);
        contents.extend_from_slice(&Sha256::digest(serialized));
        // Written aside then renamed, so a concurrent reader never sees half an entry.
        let partial = entry.with_extension(format!("partial-{}", std::process::id()));
        std::fs::write(&partial, contents)?;
        std::fs::rename(&partial, entry)
    }
}

/// The entry's serialized component, if the file exists and its checksum matches.
fn read_verified(entry: &Path) -> Option<Vec<u8>> {
    let mut contents = std::fs::read(entry).ok()?;
    let split = contents.len().checked_sub(CHECKSUM_LEN)?;
    let checksum = contents.split_off(split);
    (Sha256::digest(&contents).as_slice() == checksum.as_slice()).then_some(contents)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The smallest valid component, in the binary format.
    const EMPTY_COMPONENT: &[u8] = &[0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];

    fn outcome(cache: &ComponentCache, engine: &Engine) -> CacheOutcome {
        cache.load_or_compile(engine, EMPTY_COMPONENT).unwrap().1
    }

    fn cache() -> (ComponentCache, PathBuf) {
        let dir = std::env::temp_dir().join(format!(
            "cache-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        (ComponentCache::new(&dir), dir)
    }

    #[test]
    fn the_second_load_of_the_same_bytes_is_a_hit() {
        let (cache, _dir) = cache();
        let engine = Engine::default();
        assert_eq!(outcome(&cache, &engine), CacheOutcome::Miss);
        assert_eq!(outcome(&cache, &engine), CacheOutcome::Hit);
    }

    #[test]
    fn a_corrupted_entry_is_a_miss_and_is_rewritten() {
        let (cache, dir) = cache();
        let engine = Engine::default();
        cache.load_or_compile(&engine, EMPTY_COMPONENT).unwrap();
        let entry = std::fs::read_dir(&dir)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        let mut contents = std::fs::read(&entry).unwrap();
        contents[0] ^= 0xff;
        std::fs::write(&entry, contents).unwrap();
        assert_eq!(outcome(&cache, &engine), CacheOutcome::Miss);
        assert_eq!(outcome(&cache, &engine), CacheOutcome::Hit);
    }

    #[test]
    fn an_entry_of_another_engine_is_never_looked_up() {
        let (cache, dir) = cache();
        cache
            .load_or_compile(&Engine::default(), EMPTY_COMPONENT)
            .unwrap();
        let mut config = wasmtime::Config::new();
        config.epoch_interruption(true);
        let other = Engine::new(&config).unwrap();
        assert_eq!(outcome(&cache, &other), CacheOutcome::Miss);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
    }
}
