//! Key records: the master key of an encrypted store, wrapped by each user key that may open
//! it (`keys/<16 hex>.key`, JSON; docs/FORMAT.md). Adding or removing a user key rewrites no
//! data: only records are written and deleted.

use super::{MasterKey, Secret};
use crate::backend::Backend;
use crate::error::{Result, StoreError};
use crate::format::config::StoreConfig;
use crate::format::key::ObjectKey;
use crate::format::record;
use crate::ObjectKind;
use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

/// argon2id cost for passphrases: 64 MiB, 3 passes, one lane (about 0.1-0.3 s on a server core).
const ARGON2_MEMORY_KIB: u32 = 64 * 1024;
const ARGON2_ITERATIONS: u32 = 3;
const ARGON2_LANES: u32 = 1;
/// The largest argon2id cost a record may ask for (a damaged or hostile record must not make
/// opening the store take all memory): 4 GiB, 64 passes, 64 lanes.
const ARGON2_MAX_MEMORY_KIB: u32 = 4 << 20;
const ARGON2_MAX_ITERATIONS: u32 = 64;
const ARGON2_MAX_LANES: u32 = 64;

/// How a user key becomes the key that wraps the master key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "lowercase")]
pub enum Kdf {
    /// A passphrase, stretched with argon2id (version 0x13) over the record's salt into 32 bytes.
    Argon2id {
        /// Memory in KiB.
        memory_kib: u32,
        /// Passes.
        iterations: u32,
        /// Lanes.
        lanes: u32,
    },
    /// A 32-byte key (a key file of 64 hex digits): the keyed BLAKE3 of the salt under it.
    Key,
}

/// One key record.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeyRecord {
    /// Record format: 1.
    pub format: u32,
    /// How the user key is turned into the wrapping key.
    pub kdf: Kdf,
    /// 16 random bytes, hex.
    pub salt: String,
    /// The master key sealed with AES-256-GCM under the wrapping key (zero nonce; associated
    /// data `gstore master key ` and the record's id): 48 bytes, hex.
    pub wrapped: String,
    /// When the record was written.
    pub created_unix: u64,
    /// Who added it (`user@host`), for `gstore key list`.
    pub label: String,
    /// [`MasterKey::record_check`] of the record's id, hex: shows, to whoever holds the master
    /// key, that the record wraps this store's master key. Absent in records written before it
    /// existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<String>,
}

impl record::Versioned for KeyRecord {
    const FORMAT: u32 = 1;
    fn format(&self) -> u32 {
        self.format
    }
}

impl KeyRecord {
    /// Parses and checks a key record read from `keys/<id>.key`.
    pub fn from_json(bytes: &[u8], id: &str) -> Result<KeyRecord> {
        let bad = |d: String| StoreError::corrupt(ObjectKind::KeyRecord, id, d);
        let r: KeyRecord = record::decode(bytes, ObjectKind::KeyRecord, id)?;
        if hex::decode(&r.salt).map(|s| s.len()) != Ok(16) || hex::decode(&r.wrapped).map(|w| w.len()) != Ok(48) {
            return Err(bad("its salt must be 16 bytes and its wrapped key 48, in hex".into()));
        }
        if let Kdf::Argon2id { memory_kib, iterations, lanes } = r.kdf {
            let ok = (8 * lanes..=ARGON2_MAX_MEMORY_KIB).contains(&memory_kib)
                && (1..=ARGON2_MAX_ITERATIONS).contains(&iterations)
                && (1..=ARGON2_MAX_LANES).contains(&lanes);
            if !ok {
                return Err(bad(format!("argon2id cost {memory_kib} KiB x {iterations} x {lanes} is out of range")));
            }
        }
        Ok(r)
    }

    /// The key that wraps the master key, from `secret`; `None` when `secret` is of the other
    /// kind than the record's.
    fn wrapping_key(&self, secret: &Secret) -> Option<Zeroizing<[u8; 32]>> {
        let salt = hex::decode(&self.salt).ok()?;
        let mut out = Zeroizing::new([0u8; 32]);
        match (&self.kdf, secret) {
            (Kdf::Key, Secret::Key(k)) => *out = *blake3::keyed_hash(k, &salt).as_bytes(),
            (Kdf::Argon2id { memory_kib, iterations, lanes }, Secret::Passphrase(p)) => {
                let params = argon2::Params::new(*memory_kib, *iterations, *lanes, Some(32)).ok()?;
                argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params)
                    .hash_password_into(p.as_bytes(), &salt, &mut out[..])
                    .ok()?;
            }
            _ => return None,
        }
        Some(out)
    }

    fn cipher(wrapping: &[u8; 32]) -> LessSafeKey {
        LessSafeKey::new(UnboundKey::new(&AES_256_GCM, wrapping).expect("32-byte AES-256 key"))
    }

    fn aad(id: &str) -> Vec<u8> {
        format!("gstore master key {id}").into_bytes()
    }

    /// A new record `id` wrapping `master` under `secret`.
    fn new(id: &str, master: &MasterKey, secret: &Secret, label: String) -> KeyRecord {
        let mut salt = [0u8; 16];
        super::random(&mut salt);
        let kdf = match secret {
            Secret::Key(_) => Kdf::Key,
            Secret::Passphrase(_) => {
                Kdf::Argon2id { memory_kib: ARGON2_MEMORY_KIB, iterations: ARGON2_ITERATIONS, lanes: ARGON2_LANES }
            }
        };
        let mut r = KeyRecord {
            format: 1,
            kdf,
            salt: hex::encode(salt),
            wrapped: String::new(),
            created_unix: crate::format::now_unix(),
            label,
            check: Some(master.record_check(id).to_hex().to_string()),
        };
        let wrapping = r.wrapping_key(secret).expect("a record made for this secret's kind");
        let mut sealed = master.bytes().to_vec();
        Self::cipher(&wrapping)
            .seal_in_place_append_tag(Nonce::assume_unique_for_key([0; 12]), Aad::from(Self::aad(id)), &mut sealed)
            .expect("32 bytes seal");
        r.wrapped = hex::encode(sealed);
        r
    }

    /// True when this record (`id`) counts as a key of the store whose master key is `master`:
    /// its check holds, or it predates checks.
    fn is_key_of(&self, id: &str, master: &MasterKey) -> bool {
        self.check.as_ref().is_none_or(|c| *c == master.record_check(id).to_hex().as_str())
    }

    /// The master key, when `secret` opens this record (`id`).
    fn open(&self, id: &str, secret: &Secret) -> Option<MasterKey> {
        let wrapping = self.wrapping_key(secret)?;
        let mut sealed = Zeroizing::new(hex::decode(&self.wrapped).ok()?);
        let plain = Self::cipher(&wrapping)
            .open_in_place(Nonce::assume_unique_for_key([0; 12]), Aad::from(Self::aad(id)), &mut sealed)
            .ok()?;
        Some(MasterKey::from_bytes(plain.try_into().ok()?))
    }
}

/// `user@host` of this process, for a new record's label.
fn this_user_at_host() -> String {
    let user = crate::environment::user();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    format!("{user}@{host}")
}

/// Every key record of the store in `backend`, by id; unreadable ones as errors.
pub fn list(backend: &Backend) -> Result<Vec<(String, Result<KeyRecord>)>> {
    let mut out = Vec::new();
    for l in backend.list(crate::format::key::Family::Keys.prefix())? {
        let ObjectKey::KeyRecord(id) = &l.key else { continue };
        let rec = backend.get(&l.key).and_then(|b| KeyRecord::from_json(&b, id));
        out.push((id.clone(), rec));
    }
    Ok(out)
}

/// Opens the master key of the store in `backend` (described as `store`, configured by
/// `config`) with `secret`: from the first record it opens whose master key makes the
/// config's check (a record left by an init that lost a race to another opens another key).
pub fn unlock(backend: &Backend, secret: &Secret, store: &str, config: &StoreConfig) -> Result<MasterKey> {
    let records = list(backend)?;
    if records.is_empty() {
        return Err(StoreError::corrupt(ObjectKind::Store, store, "it is encrypted but holds no key records (keys/)"));
    }
    let mut opened = None;
    for (id, rec) in &records {
        if let Some(master) = rec.as_ref().ok().and_then(|r| r.open(id, secret)) {
            match config.check_sealed(|b| master.config_check(b), store) {
                Ok(()) => return Ok(master),
                Err(e) => opened = Some(StoreError::from(e)),
            }
        }
    }
    Err(opened.unwrap_or_else(|| StoreError::KeyRejected(store.to_string())))
}

/// Adds a record wrapping `master` under `secret`; returns its id.
pub fn add(backend: &Backend, master: &MasterKey, secret: &Secret) -> Result<String> {
    let mut raw = [0u8; 8];
    super::random(&mut raw);
    let id = hex::encode(raw);
    let rec = KeyRecord::new(&id, master, secret, this_user_at_host());
    let json = serde_json::to_vec_pretty(&rec).expect("key record serializes");
    backend.create_record(&ObjectKey::KeyRecord(id.clone()), json)?;
    Ok(id)
}

/// The key records being removed (`keys/retired.json`, JSON `{"format": 1, "retired":
/// [ids]}`). A removal adds its record here with a compare-and-swap write before it deletes
/// the record, so of two removals at once the later sees the earlier and counts what is left
/// without it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RetiredKeys {
    /// Format: 1.
    pub format: u32,
    /// Ids of records being (or already) removed.
    pub retired: std::collections::BTreeSet<String>,
}

impl record::Versioned for RetiredKeys {
    const FORMAT: u32 = 1;
    fn format(&self) -> u32 {
        self.format
    }
}

impl RetiredKeys {
    /// Parses and checks the object read from `keys/retired.json`.
    pub fn from_json(bytes: &[u8]) -> Result<RetiredKeys> {
        Ok(record::decode(bytes, ObjectKind::RetiredKeys, "keys/retired.json")?)
    }
}

/// Removes record `id` of the store whose master key is `master`; refuses to remove the last
/// record that is a key of that store (the store could not be opened again), also when
/// another removal runs at the same moment.
pub fn remove(backend: &Backend, master: &MasterKey, id: &str) -> Result<()> {
    backend.update(&ObjectKey::RetiredKeys, |current| {
        let mut retired = match current {
            Some(bytes) => RetiredKeys::from_json(bytes)?,
            None => RetiredKeys { format: 1, ..Default::default() },
        };
        let records = list(backend)?;
        if !records.iter().any(|(r, _)| r == id) {
            return Err(StoreError::NotFound { what: ObjectKind::Key, key: id.to_string() });
        }
        let others = records.iter().filter(|(r, rec)| {
            r != id && !retired.retired.contains(r) && rec.as_ref().is_ok_and(|rec| rec.is_key_of(r, master))
        });
        if others.count() == 0 {
            return Err(StoreError::Refused(format!(
                "key {id} is the store's last key: without it nobody could open the store again; add another first (`gstore key add`)"
            )));
        }
        // Records already gone need no entry.
        retired.retired.retain(|r| records.iter().any(|(id, _)| id == r));
        retired.retired.insert(id.to_string());
        Ok(Some(serde_json::to_vec(&retired).expect("retired keys serialize")))
    })?;
    backend.delete(&ObjectKey::KeyRecord(id.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_secret(b: u8) -> Secret {
        Secret::Key(Zeroizing::new([b; 32]))
    }

    #[test]
    fn records_open_with_their_own_secret_only() {
        let master = MasterKey::generate();
        let r = KeyRecord::new("0011223344556677", &master, &key_secret(1), "t".into());
        assert_eq!(r.open("0011223344556677", &key_secret(1)).unwrap().bytes(), master.bytes());
        assert!(r.open("0011223344556677", &key_secret(2)).is_none(), "another key");
        assert!(r.open("8899aabbccddeeff", &key_secret(1)).is_none(), "a record moved to another id");
        let pass = |s: &str| Secret::Passphrase(Zeroizing::new(s.into()));
        let mut r = KeyRecord::new("0011223344556677", &master, &pass("correct horse"), "t".into());
        assert!(matches!(r.kdf, Kdf::Argon2id { .. }));
        assert_eq!(r.open("0011223344556677", &pass("correct horse")).unwrap().bytes(), master.bytes());
        assert!(r.open("0011223344556677", &pass("correct horsE")).is_none());
        assert!(r.open("0011223344556677", &key_secret(1)).is_none(), "a key is not a passphrase");
        r.kdf = Kdf::Argon2id { memory_kib: u32::MAX, iterations: 3, lanes: 1 };
        let json = serde_json::to_vec(&r).unwrap();
        assert!(KeyRecord::from_json(&json, "x").unwrap_err().to_string().contains("out of range"));
    }

    #[test]
    fn keys_are_added_listed_and_removed_but_never_the_last() {
        let backend = Backend::memory();
        let master = MasterKey::generate();
        let config = StoreConfig::default().encrypted(|b| master.config_check(b));
        // A record of another master key (an init that lost a race) is passed over.
        add(&backend, &MasterKey::generate(), &key_secret(2)).unwrap();
        let a = add(&backend, &master, &key_secret(1)).unwrap();
        let b = add(&backend, &master, &key_secret(2)).unwrap();
        assert_eq!(list(&backend).unwrap().len(), 3);
        let m = unlock(&backend, &key_secret(2), "s", &config).unwrap();
        assert_eq!(m.bytes(), master.bytes());
        assert!(matches!(unlock(&backend, &key_secret(3), "s", &config), Err(StoreError::KeyRejected(_))));
        remove(&backend, &master, &b).unwrap();
        let err = unlock(&backend, &key_secret(2), "s", &config).unwrap_err().to_string();
        assert!(err.contains("config.json was changed"), "removed key: only the stray record opens: {err}");
        unlock(&backend, &key_secret(1), "s", &config).unwrap();
        // A config changed without the key is refused.
        let mut changed = config.clone();
        changed.zstd_level = 19;
        assert!(unlock(&backend, &key_secret(1), "s", &changed)
            .unwrap_err()
            .to_string()
            .contains("config.json was changed"));
        // The stray record is no key of this store: `a` is the last one.
        assert!(remove(&backend, &master, &a).unwrap_err().to_string().contains("last key"));
        let stray = list(&backend).unwrap().into_iter().map(|(id, _)| id).find(|id| *id != a).unwrap();
        remove(&backend, &master, &stray).unwrap();
        assert!(remove(&backend, &master, &a).unwrap_err().to_string().contains("last key"));
        assert!(matches!(remove(&backend, &master, "0000000000000000"), Err(StoreError::NotFound { .. })));
    }

    #[test]
    fn two_removals_at_once_never_remove_the_last_key() {
        let backend = Backend::memory();
        let master = MasterKey::generate();
        let a = add(&backend, &master, &key_secret(1)).unwrap();
        let b = add(&backend, &master, &key_secret(2)).unwrap();
        // Removal of `a` marks it retired, then (before it deletes the record) removal of `b`
        // runs: it must see `a` going.
        let retired = RetiredKeys { format: 1, retired: [a.clone()].into() };
        backend.put_if(&ObjectKey::RetiredKeys, serde_json::to_vec(&retired).unwrap(), None).unwrap();
        assert!(remove(&backend, &master, &b).unwrap_err().to_string().contains("last key"));
        // Both at once from threads: exactly one succeeds, one record is left.
        let backend = Backend::memory();
        let a = add(&backend, &master, &key_secret(1)).unwrap();
        let b = add(&backend, &master, &key_secret(2)).unwrap();
        let results: Vec<bool> = std::thread::scope(|s| {
            let ha = s.spawn(|| remove(&backend, &master, &a).is_ok());
            let hb = s.spawn(|| remove(&backend, &master, &b).is_ok());
            vec![ha.join().unwrap(), hb.join().unwrap()]
        });
        assert_eq!(results.iter().filter(|ok| **ok).count(), 1, "{results:?}");
        assert_eq!(list(&backend).unwrap().len(), 1);
    }
}
