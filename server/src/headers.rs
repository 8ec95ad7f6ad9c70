//! What the routes read from a request's headers.

use axum::http::{header, HeaderMap};
use object_store::GetRange;

/// The length a request says its body has (`Content-Length`), if it says one.
pub(crate) fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

/// Parses `bytes=A-B` / `bytes=A-` (one range).
pub(crate) fn parse_range(v: &str) -> Option<GetRange> {
    let (a, b) = v.strip_prefix("bytes=")?.split_once('-')?;
    let start: u64 = a.parse().ok()?;
    if b.is_empty() {
        return Some(GetRange::Offset(start));
    }
    let end: u64 = b.parse().ok()?;
    let stop = end.checked_add(1)?;
    (end >= start).then_some(GetRange::Bounded(start..stop))
}
