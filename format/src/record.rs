//! The small JSON records gstore stores (tags, leases, damage records, restore profiles, key
//! records, retention policies): each says its `format`, and a reader refuses one it cannot
//! read, as damage of that object, naming it.

use crate::error::{FormatError, ObjectKind, Result};
use serde::de::DeserializeOwned;

/// A stored JSON record that says its format.
pub trait Versioned: DeserializeOwned {
    /// The format this gstore writes and reads.
    const FORMAT: u32;

    /// The format the record says it has.
    fn format(&self) -> u32;
}

/// Parses the record of kind `what` stored under `key`; [`FormatError::Corrupt`] when it is not
/// JSON of its shape, or says a format this gstore does not read.
pub fn decode<T: Versioned>(bytes: &[u8], what: ObjectKind, key: &str) -> Result<T> {
    let bad = |d: String| FormatError::corrupt(what, key, d);
    let r: T = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
    if r.format() != T::FORMAT {
        return Err(bad(format!(
            "format {} is not supported (this gstore reads format {}; a newer one may have written it)",
            r.format(),
            T::FORMAT
        )));
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    struct Note {
        format: u32,
    }

    impl Versioned for Note {
        const FORMAT: u32 = 1;
        fn format(&self) -> u32 {
            self.format
        }
    }

    #[test]
    fn a_record_of_another_format_or_shape_is_damage_that_names_it() {
        assert_eq!(decode::<Note>(br#"{"format": 1}"#, ObjectKind::Lease, "leases/x").unwrap().format, 1);
        let newer = decode::<Note>(br#"{"format": 2}"#, ObjectKind::Lease, "leases/x").unwrap_err();
        assert!(matches!(newer, FormatError::Corrupt { .. }), "{newer}");
        assert!(newer.to_string().contains("format 2") && newer.to_string().contains("leases/x"), "{newer}");
        assert!(decode::<Note>(b"{oops", ObjectKind::Lease, "leases/x").is_err());
    }
}
