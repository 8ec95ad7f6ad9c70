//! A manifest read from a store (its id is its hash, so the id check passes and the parser
//! behind it is reached); a decoded manifest encodes back to the same bytes' meaning.
use gstore_format::manifest::Manifest;
use gstore_format::ObjectId;

/// Runs one input; panics on a bug.
pub fn run(data: &[u8]) {
    let id = ObjectId::of(data);
    if let Ok(m) = Manifest::decode(data, &id) {
        let again = m.encode();
        let back = Manifest::decode(&again, &ObjectId::of(&again)).expect("a decoded manifest encodes to a valid one");
        assert_eq!(back.entries.len(), m.entries.len());
        for e in &m.entries {
            gstore_format::manifest::check_relative_path(&e.path).expect("decode accepted an unsafe path");
        }
    }
}
