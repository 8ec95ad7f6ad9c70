//! Which object a request path names. Only the store's own key shapes are accepted, so
//! nothing outside the store's namespace can be read or written (no `..`, no NUL, no
//! unknown prefixes).

use gstore_store::{backend, ObjectId, TagRef};

/// A store object named by a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    /// `config.json`.
    Config,
    /// `packs/xx/<id>.pack`.
    Pack(ObjectId),
    /// `manifests/xx/<id>.manifest`.
    Manifest(ObjectId),
    /// `tags/<name>/<version>.tag`.
    Tag(TagRef),
    /// `profiles/xx/<manifest id>.profile`.
    Profile(ObjectId),
    /// `leases/<32 hex>.lease`.
    Lease(String),
    /// `tombstones/<pack or manifest key>`.
    Tombstone(Box<Key>),
    /// `gc/lock`.
    GcLock,
}

impl Key {
    /// Parses a key, refusing anything but the exact shapes the store writes.
    pub fn parse(key: &str) -> Result<Key, String> {
        let bad = || format!("not a gstore object key: {:?}", key.chars().take(200).collect::<String>());
        if key == backend::CONFIG_KEY {
            return Ok(Key::Config);
        }
        if key == backend::GC_LOCK_KEY {
            return Ok(Key::GcLock);
        }
        if let Some(name) = key.strip_prefix("leases/").and_then(|r| r.strip_suffix(".lease")) {
            let ok = name.len() == 32 && name.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
            return if ok { Ok(Key::Lease(name.to_string())) } else { Err(bad()) };
        }
        if let Some(inner) = backend::tombstoned_key(key) {
            return match Key::parse(inner) {
                Ok(k @ (Key::Pack(_) | Key::Manifest(_))) => Ok(Key::Tombstone(Box::new(k))),
                _ => Err(bad()),
            };
        }
        let id_in = |rest: &str, suffix: &str| -> Option<ObjectId> {
            let (dir, file) = rest.split_once('/')?;
            let id = ObjectId::from_hex(file.strip_suffix(suffix)?).ok()?;
            (id.to_hex()[..2] == *dir).then_some(id)
        };
        if let Some(rest) = key.strip_prefix("packs/") {
            return id_in(rest, ".pack").map(Key::Pack).ok_or_else(bad);
        }
        if let Some(rest) = key.strip_prefix("manifests/") {
            return id_in(rest, ".manifest").map(Key::Manifest).ok_or_else(bad);
        }
        if let Some(rest) = key.strip_prefix("profiles/") {
            return id_in(rest, ".profile").map(Key::Profile).ok_or_else(bad);
        }
        if let Some(rest) = key.strip_prefix("tags/") {
            let (name, file) = rest.split_once('/').ok_or_else(bad)?;
            let version = file.strip_suffix(".tag").ok_or_else(bad)?;
            let tag = TagRef::parse(&format!("{name}:{version}")).map_err(|e| e.to_string())?;
            if backend::tag_key(&tag.name, &tag.version) != key {
                return Err(bad());
            }
            return Ok(Key::Tag(tag));
        }
        Err(bad())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepts_store_keys_and_refuses_tricks() {
        let id = ObjectId::of(b"x");
        assert_eq!(Key::parse(&backend::pack_key(&id)), Ok(Key::Pack(id)));
        assert_eq!(Key::parse(&backend::manifest_key(&id)), Ok(Key::Manifest(id)));
        assert_eq!(Key::parse(&backend::profile_key(&id)), Ok(Key::Profile(id)));
        assert!(matches!(Key::parse("tags/app/v1.tag"), Ok(Key::Tag(_))));
        assert_eq!(Key::parse("config.json"), Ok(Key::Config));
        assert_eq!(Key::parse("gc/lock"), Ok(Key::GcLock));
        let lease = backend::lease_key(&"0a".repeat(16));
        assert_eq!(Key::parse(&lease), Ok(Key::Lease("0a".repeat(16))));
        let tomb = backend::tombstone_key(&backend::pack_key(&id));
        assert_eq!(Key::parse(&tomb), Ok(Key::Tombstone(Box::new(Key::Pack(id)))));
        let long = format!("tags/{}/v.tag", "a".repeat(300));
        for bad in [
            "tags/../x.tag",
            "tags/a/../../etc.tag",
            "tags/a\0b/v.tag",
            "packs/zz/00.pack",
            "index/LOCK",
            "tombstones/tags/a/v.tag",
            "tombstones/config.json",
            "leases/../x.lease",
            "leases/ABC.lease",
            "profiles/zz/00.profile",
            "tombstones/profiles/00/00.profile",
            "../config.json",
            "",
            &long,
        ] {
            assert!(Key::parse(bad).is_err(), "{bad:?} accepted");
        }
        let wrong_dir = format!("packs/00/{}.pack", id.to_hex());
        assert!(id.to_hex().starts_with("00") || Key::parse(&wrong_dir).is_err());
    }

    proptest! {
        #[test]
        fn never_panics_and_only_accepts_round_trips(s in ".{0,300}") {
            if let Ok(k) = Key::parse(&s) {
                let again = match &k {
                    Key::Config => backend::CONFIG_KEY.to_string(),
                    Key::Pack(id) => backend::pack_key(id),
                    Key::Manifest(id) => backend::manifest_key(id),
                    Key::Profile(id) => backend::profile_key(id),
                    Key::Tag(t) => backend::tag_key(&t.name, &t.version),
                    Key::Lease(name) => backend::lease_key(name),
                    Key::Tombstone(_) => s.clone(),
                    Key::GcLock => backend::GC_LOCK_KEY.to_string(),
                };
                prop_assert_eq!(again, s);
            }
        }
    }
}
