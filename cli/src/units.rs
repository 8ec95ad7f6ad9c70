//! Values people type: sizes with units (`1G`, `512MiB`, `1.5GB`) and listen addresses with
//! host names (`localhost:8420`).

pub use gstore_store::units::size;

/// [`size`], at most `u32::MAX` (chunk sizes).
pub fn size_u32(text: &str) -> Result<u32, String> {
    u32::try_from(size(text)?).map_err(|_| format!("{text:?} is too large here (at most 4GiB - 1)"))
}

/// [`size`] as a `usize`.
pub fn size_usize(text: &str) -> Result<usize, String> {
    usize::try_from(size(text)?).map_err(|_| format!("{text:?} is too large"))
}

/// A socket address: `IP:PORT`, `[IPv6]:PORT`, or `HOST:PORT` resolved now (its first address).
pub fn listen_addr(text: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(a) = text.parse() {
        return Ok(a);
    }
    let mut found = text.to_socket_addrs().map_err(|e| format!("{text:?}: expected HOST:PORT or IP:PORT ({e})"))?;
    found.next().ok_or_else(|| format!("{text:?} resolves to no address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_with_units() {
        assert_eq!(size_u32("64KiB"), Ok(64 << 10));
        assert!(size_u32("4GiB").unwrap_err().contains("too large"));
    }

    #[test]
    fn listen_addresses_with_host_names() {
        assert_eq!(listen_addr("127.0.0.1:8420").unwrap().port(), 8420);
        assert!(listen_addr("localhost:9000").unwrap().ip().is_loopback());
        assert!(listen_addr("localhost").is_err());
    }
}
