//! Lazy, else eager: how a restore's memory comes back, and the one rule for when a restore
//! that would be lazy writes the image out first instead (process and container restores
//! alike).

use crate::error::LazyError;
use crate::prepare::Prepared;
use serde::Serialize;

/// How a restored process's memory came back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Served from the store while the process runs.
    Lazy,
    /// The whole image written out first.
    Eager,
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Lazy => "lazy",
            Mode::Eager => "eager",
        })
    }
}

/// Whether a restore here may serve memory lazily: `Ok` unless `eager` asks otherwise
/// (`Err(None)`) or this machine cannot (`Err(Some(why))`: userfaultfd is missing, say).
pub fn lazy_here(eager: bool) -> Result<(), Option<String>> {
    if eager {
        return Err(None);
    }
    crate::uffd::check_support().map_err(Some)
}

/// What a lazy preparation's outcome means for the restore: `Ok(Some(prepared))` to go on
/// lazily, `Ok(None)` with `why` set to write the image out instead (the machine or the image
/// cannot be served lazily), or the error of a real failure.
pub fn lazy_or_eager(
    prepared: Result<Prepared, LazyError>,
    why: &mut Option<String>,
) -> Result<Option<Prepared>, LazyError> {
    match prepared {
        Ok(p) => Ok(Some(p)),
        Err(LazyError::Unsupported(reason) | LazyError::Image { detail: reason, .. }) => {
            *why = Some(reason);
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_falls_back_and_what_fails() {
        let mut why = None;
        assert!(lazy_or_eager(Err(LazyError::Unsupported("no userfaultfd".into())), &mut why).unwrap().is_none());
        assert_eq!(why.as_deref(), Some("no userfaultfd"));
        let image = LazyError::Image { file: "pagemap-1.img".into(), detail: "odd entry".into() };
        assert!(lazy_or_eager(Err(image), &mut why).unwrap().is_none());
        assert_eq!(why.as_deref(), Some("odd entry"));
        let mut why = None;
        assert!(lazy_or_eager(Err(LazyError::Protocol("gone".into())), &mut why).is_err());
        assert!(why.is_none(), "a real failure is no reason to go eager");
        assert_eq!(lazy_here(true), Err(None));
        assert_eq!(serde_json::to_value(Mode::Lazy).unwrap(), "lazy");
    }
}
