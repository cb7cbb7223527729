//! Compiled components on disk, so starting or reloading a guest compiled before is near-instant.
//!
//! An entry is keyed by the SHA-256 of the component's bytes and by the engine's compatibility
//! hash (wasmtime version, compiler settings, CPU features), so an entry made by another engine
//! is never looked up. An entry ends with the SHA-256 of its contents, checked before wasmtime
//! sees it: a truncated or damaged entry is a miss, recompiled and rewritten, never loaded.
//!
//! Loading an entry runs its machine code, so a checksum is not enough: whoever can write the
//! directory could write a matching one. Entries are trusted only in a directory this user owns
//! and no one else may write (the host creates it `0700`), and only as regular files (no
//! symlinks) that this user owns and no one else may write. Anything else is compiled afresh and
//! nothing is written there. Entries are written to a new file of a random name, created
//! exclusively (never through an existing file or symlink), then renamed into place.

use std::collections::hash_map::DefaultHasher;
use std::fs::{DirBuilder, Metadata, OpenOptions};
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
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
        let trusted_dir = match self.private_dir() {
            Ok(true) => true,
            Ok(false) => {
                tracing::warn!(
                    dir = %self.dir.display(),
                    "the compiled-component cache is not private to this user (owner, or writable by others): not used"
                );
                false
            }
            Err(error) => {
                tracing::warn!(dir = %self.dir.display(), %error, "cannot use the compiled-component cache");
                false
            }
        };
        if let Some(serialized) = trusted_dir.then(|| read_verified(&entry)).flatten() {
            // SAFETY: the entry is a regular file in a directory only this user can write, that
            // only this user owns and can write, so `store` below wrote it, for an engine with
            // this very compatibility hash (part of the key); its checksum matched, so these are
            // the bytes `Component::serialize` produced. wasmtime checks its own header as well.
            if let Ok(component) = unsafe { Component::deserialize(engine, &serialized) } {
                return Ok((component, CacheOutcome::Hit));
            }
        }
        let component = Component::new(engine, bytes)?;
        if trusted_dir && let Err(error) = self.store(&entry, &component.serialize()?) {
            tracing::warn!(path = %entry.display(), %error, "cannot write the compiled-component cache");
        }
        Ok((component, CacheOutcome::Miss))
    }

    /// Creates the directory (`0700`) if missing; whether it is private: a real directory this
    /// user owns that no one else can write. One this user owns and only reads are allowed to is
    /// tightened to `0700`.
    fn private_dir(&self) -> std::io::Result<bool> {
        if std::fs::symlink_metadata(&self.dir).is_err() {
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&self.dir)?;
        }
        let metadata = std::fs::symlink_metadata(&self.dir)?;
        if !metadata.is_dir() || !owned_and_not_writable_by_others(&metadata) {
            return Ok(false);
        }
        if metadata.mode() & 0o077 != 0 {
            std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700))?;
        }
        Ok(true)
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
        let mut contents = Vec::with_capacity(serialized.len() + CHECKSUM_LEN);
        contents.extend_from_slice(serialized);
        contents.extend_from_slice(&Sha256::digest(serialized));
        // Written aside then renamed, so a concurrent reader never sees half an entry. The name
        // is random and the file new (`O_EXCL`): nothing planted there is followed or reused.
        let partial = entry.with_extension(format!("partial-{}", uuid::Uuid::new_v4().simple()));
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&partial)?;
        let written = file.write_all(&contents).and_then(|()| {
            drop(file);
            std::fs::rename(&partial, entry)
        });
        if written.is_err() {
            let _ = std::fs::remove_file(&partial);
        }
        written
    }
}

/// Whether this user owns the file or directory and no one else can write it.
fn owned_and_not_writable_by_others(metadata: &Metadata) -> bool {
    // SAFETY: `geteuid` has no preconditions and cannot fail.
    let user = unsafe { libc::geteuid() };
    metadata.uid() == user && metadata.mode() & 0o022 == 0
}

/// The entry's serialized component, if the entry is a regular file (not a symlink) this user
/// owns and no one else can write, and its checksum matches.
fn read_verified(entry: &Path) -> Option<Vec<u8>> {
    let metadata = std::fs::symlink_metadata(entry).ok()?;
    if !metadata.is_file() || !owned_and_not_writable_by_others(&metadata) {
        return None;
    }
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

    fn only_entry(dir: &Path) -> PathBuf {
        std::fs::read_dir(dir)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path()
    }

    #[test]
    fn the_cache_directory_is_created_private() {
        let (cache, dir) = cache();
        outcome(&cache, &Engine::default());
        let mode = std::fs::metadata(&dir).unwrap().mode();
        assert_eq!(mode & 0o777, 0o700, "{mode:o}");
    }

    #[test]
    fn a_valid_entry_in_a_directory_others_can_write_is_never_loaded() {
        let (cache, dir) = cache();
        let engine = Engine::default();
        outcome(&cache, &engine);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(outcome(&cache, &engine), CacheOutcome::Miss);
        assert_eq!(outcome(&cache, &engine), CacheOutcome::Miss);
    }

    #[test]
    fn an_entry_others_can_write_is_never_loaded() {
        let (cache, dir) = cache();
        let engine = Engine::default();
        outcome(&cache, &engine);
        let entry = only_entry(&dir);
        std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(outcome(&cache, &engine), CacheOutcome::Miss);
    }

    #[test]
    fn a_symlinked_entry_is_never_loaded() {
        let (cache, dir) = cache();
        let engine = Engine::default();
        outcome(&cache, &engine);
        let entry = only_entry(&dir);
        // A valid entry, moved elsewhere and linked back: whoever controls the link's target
        // would control the code.
        let elsewhere = dir.with_extension("elsewhere");
        std::fs::rename(&entry, &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &entry).unwrap();
        assert_eq!(outcome(&cache, &engine), CacheOutcome::Miss);
        // The link is replaced by a real entry, which then loads.
        assert_eq!(outcome(&cache, &engine), CacheOutcome::Hit);
        assert!(std::fs::symlink_metadata(&entry).unwrap().is_file());
        let _ = std::fs::remove_file(elsewhere);
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
