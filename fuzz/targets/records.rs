//! The small records a store holds and the names it parses, chosen by the first byte: tag
//! records, leases, restore profiles, the store config, object keys and tag names.
use gstore_format::{
    key::ObjectKey, lease::LeaseRecord, profile::Profile, tag::TagRecord, ObjectId, StoreConfig, TagRef,
};

/// Runs one input; panics on a bug.
pub fn run(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else { return };
    let text = String::from_utf8_lossy(rest);
    match which % 6 {
        0 => {
            let tag = TagRef::parse("app:v1").unwrap();
            if let Ok(r) = TagRecord::from_json(rest, &tag) {
                let _ = r.manifest_id();
                let _ = r.set_time();
            }
        }
        1 => {
            if let Ok(l) = LeaseRecord::from_json(rest, "leases/fuzz.lease") {
                let _ = l.owner.describe();
                let _ = l.pack_ids().count() + l.manifest_ids().count();
            }
        }
        2 => {
            let _ = Profile::from_json(rest, &ObjectId::of(rest));
        }
        3 => {
            if let Ok(c) = StoreConfig::from_json(rest) {
                c.validate().expect("from_json returned a config that does not validate");
            }
        }
        4 => {
            if let Ok(k) = ObjectKey::parse(&text) {
                assert_eq!(k.to_string(), text, "a key that does not round-trip was accepted");
            }
        }
        _ => {
            if let Ok(t) = TagRef::parse(&text) {
                let _ = t.check_new();
            }
        }
    }
}
