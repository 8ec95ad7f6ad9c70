//! Encryption at rest (docs/SECURITY.md). An encrypted store has a random master key, kept
//! only wrapped by user keys in key records (`keys/<id>.key`, [`keyring`]); every object
//! holding data or names of data (packs, manifests, tags, leases, restore profiles) is
//! sealed ([`sealed`]) under a key derived from it, and `config.json` carries a check that
//! only the master key can make, so a store's settings cannot be swapped unnoticed.

pub mod keyring;
pub mod sealed;
mod secret;

pub use secret::Secret;

use crate::error::StoreError;
use zeroize::Zeroizing;

/// Fills `buf` from the operating system's random number generator.
pub(crate) fn random(buf: &mut [u8]) {
    aws_lc_rs::rand::fill(buf).expect("the OS random number generator works");
}

/// An encrypted store's master key and the keys derived from it.
pub struct MasterKey(Zeroizing<[u8; 32]>);

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MasterKey(..)")
    }
}

impl MasterKey {
    /// A new random master key (for `gstore init --encrypt`).
    pub fn generate() -> MasterKey {
        let mut k = Zeroizing::new([0u8; 32]);
        random(&mut k[..]);
        MasterKey(k)
    }

    fn derive(&self, purpose: &str) -> [u8; 32] {
        blake3::derive_key(&format!("gstore 2026-11-26 {purpose}"), &self.0[..])
    }

    /// The sealer of the store's objects.
    pub fn sealer(&self) -> sealed::Sealer {
        sealed::Sealer::new(self.derive("sealed objects"))
    }

    /// How the store names chunks: keyed BLAKE3 under a key derived from this master key.
    pub fn chunk_ids(&self) -> crate::ChunkIds {
        crate::ChunkIds::Keyed(self.derive("chunk ids"))
    }

    /// The check `config.json` carries: the keyed BLAKE3 of the config (serialized with an
    /// empty check) under a key derived from this master key.
    pub fn config_check(&self, config_without_check: &[u8]) -> blake3::Hash {
        blake3::keyed_hash(&self.derive("config check"), config_without_check)
    }

    /// The check a key record `id` wrapping this master key carries: the keyed BLAKE3 of its
    /// id under a key derived from this master key. A record whose check holds is one of this
    /// store's keys; one left by an `init` that lost a race carries another master key's.
    pub fn record_check(&self, id: &str) -> blake3::Hash {
        blake3::keyed_hash(&self.derive("key record check"), id.as_bytes())
    }

    fn bytes(&self) -> &[u8; 32] {
        &self.0
    }

    fn from_bytes(b: [u8; 32]) -> MasterKey {
        MasterKey(Zeroizing::new(b))
    }
}

/// The error for a store that is encrypted when no key was given.
pub(crate) fn key_required(store: &str) -> StoreError {
    StoreError::KeyRequired(store.to_string())
}
