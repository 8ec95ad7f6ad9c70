//! Small `/proc` queries about processes and the machine's memory.

/// The state letter of process `pid` from `/proc/PID/stat` (`R`, `S`, `Z`, ...), or `None`
/// when there is no such process.
pub fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_state(&stat)
}

/// Waits until process `pid` runs nothing: stopped (state `T`), or a zombie (a tree can hold
/// one), for at most `timeout`. On failure, its last state letter, or `gone`.
pub fn wait_stopped(pid: u32, timeout: std::time::Duration) -> Result<(), String> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match state(pid) {
            Some('T' | 'Z') => return Ok(()),
            None | Some('X' | 'x') => return Err("gone".to_string()),
            Some(s) if std::time::Instant::now() >= deadline => return Err(s.to_string()),
            Some(_) => std::thread::sleep(std::time::Duration::from_micros(200)),
        }
    }
}

/// True when `pid` is a live process: it exists and is neither a zombie nor dead. A zombie
/// still holds its pid (until its parent or PID 1 reaps it) but cannot be checkpointed.
pub fn is_alive(pid: u32) -> bool {
    matches!(state(pid), Some(s) if s != 'Z' && s != 'X' && s != 'x')
}

/// True when `pid` is taken, by a live process or a zombie.
pub fn exists(pid: u32) -> bool {
    pid != 0 && std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// The memory process `pid` holds resident (`/proc/PID/statm`), in bytes, or `None` when
/// there is no such process.
pub fn resident_bytes(pid: u32) -> Option<u64> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * crate::images::PAGE_SIZE)
}

/// Field `name` of `/proc/meminfo`'s text `meminfo` (e.g. `MemAvailable`), in bytes.
pub fn meminfo_bytes(meminfo: &str, name: &str) -> Option<u64> {
    meminfo.lines().find_map(|l| {
        let kib = l.strip_prefix(name)?.strip_prefix(':')?.trim().strip_suffix("kB")?;
        kib.trim().parse::<u64>().ok().map(|k| k * 1024)
    })
}

/// `/proc/meminfo`'s text (empty when it cannot be read).
pub fn meminfo() -> String {
    std::fs::read_to_string("/proc/meminfo").unwrap_or_default()
}

/// The parent of process `pid`, from `/proc/PID/stat`, or `None` when there is no such process.
pub fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    after_comm(&stat)?.nth(1)?.parse().ok()
}

/// `roots` and every process below them (children of children included), from `/proc`:
/// roots first, then each generation after the one before it. Processes that start or end
/// while `/proc` is read may be missed or listed.
pub fn descendants(roots: &[u32]) -> Vec<u32> {
    let mut parent_of = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            if let Some(ppid) = parent(pid) {
                parent_of.push((pid, ppid));
            }
        }
    }
    let mut out: Vec<u32> = roots.to_vec();
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        let children: Vec<u32> =
            parent_of.iter().filter(|&&(c, pp)| pp == p && !out.contains(&c)).map(|&(c, _)| c).collect();
        out.extend(children);
        i += 1;
    }
    out
}

/// The largest deleted file that processes `pids` hold open or mapped (`/proc/PID/fd` and
/// `/proc/PID/map_files` links whose target ends in ` (deleted)`), in the bytes it takes on
/// disk (blocks × 512, what CRIU weighs against its `--ghost-limit`); 0 when there is none.
/// Links that vanish while they are read are skipped.
pub fn largest_deleted_file(pids: &[u32]) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut largest = 0;
    for pid in pids {
        for dir in ["fd", "map_files"] {
            let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/{dir}")) else { continue };
            for link in entries.flatten().map(|e| e.path()) {
                let deleted = std::fs::read_link(&link).is_ok_and(|t| t.to_string_lossy().ends_with(" (deleted)"));
                if let (true, Ok(meta)) = (deleted, std::fs::metadata(&link)) {
                    largest = largest.max(meta.blocks() * 512);
                }
            }
        }
    }
    largest
}

/// The TCP connections a process tree holds (sockets neither listening nor closed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TcpLinks {
    /// How many sockets of the tree are connected.
    pub connected: usize,
    /// How many of those lead out of the tree: no process of it holds their other end.
    pub outside: usize,
}

/// The TCP connections processes `pids` hold: their sockets (`/proc/PID/fd` links
/// `socket:[INODE]`) found in the TCP tables of their network namespaces
/// (`/proc/PID/net/tcp`, `tcp6`) in a state other than listening (`0A`) or closed (`07`); a
/// connection's other end is the socket whose local and remote addresses are swapped.
pub fn tcp_links(pids: &[u32]) -> TcpLinks {
    let mut held = std::collections::HashSet::new();
    let mut namespaces = std::collections::HashMap::new();
    for pid in pids {
        if let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
            for link in entries.flatten().filter_map(|e| std::fs::read_link(e.path()).ok()) {
                let link = link.to_string_lossy().into_owned();
                if let Some(inode) = link.strip_prefix("socket:[").and_then(|l| l.strip_suffix(']')) {
                    held.insert(inode.to_string());
                }
            }
        }
        if let Ok(ns) = std::fs::read_link(format!("/proc/{pid}/ns/net")) {
            namespaces.entry(ns).or_insert(*pid);
        }
    }
    let mut ends = Vec::new();
    for pid in namespaces.values() {
        for table in ["tcp", "tcp6"] {
            let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else { continue };
            for line in text.lines().skip(1) {
                let f: Vec<&str> = line.split_whitespace().collect();
                if f.len() > 9 && f[3] != "0A" && f[3] != "07" && held.contains(f[9]) {
                    ends.push((f[1].to_string(), f[2].to_string()));
                }
            }
        }
    }
    let outside = ends.iter().filter(|(local, remote)| !ends.iter().any(|(l, r)| l == remote && r == local)).count();
    TcpLinks { connected: ends.len(), outside }
}

/// Process `pid`'s command line (`/proc/PID/cmdline`), its arguments joined by spaces, or
/// `None` when there is no such process. A process CRIU restored has its old one.
pub fn cmdline(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(String::from_utf8_lossy(&raw).replace('\0', " ").trim_end().to_string())
}

/// Whether process `pid` has a handler for signal `signal` (`SigCgt` in `/proc/PID/status`):
/// one that does not would be ended by it.
pub fn catches(pid: u32, signal: i32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return false };
    let mask =
        status.lines().find_map(|l| l.strip_prefix("SigCgt:")).and_then(|m| u64::from_str_radix(m.trim(), 16).ok());
    (1..=64).contains(&signal) && mask.is_some_and(|m| m & (1 << (signal - 1)) != 0)
}

/// The fields of a `/proc/PID/stat` line after the `(comm)` field, which may itself contain
/// spaces and parentheses: state, ppid, ...
fn after_comm(stat: &str) -> Option<std::str::SplitWhitespace<'_>> {
    Some(stat.rsplit_once(')')?.1.split_whitespace())
}

/// The state letter of a `/proc/PID/stat` line.
fn parse_stat_state(stat: &str) -> Option<char> {
    after_comm(stat)?.next()?.chars().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_fields_are_read_in_bytes() {
        let meminfo = "MemTotal:       131072000 kB\nMemFree:   1000 kB\nMemAvailable:    2048 kB\n";
        assert_eq!(meminfo_bytes(meminfo, "MemAvailable"), Some(2048 * 1024));
        assert_eq!(meminfo_bytes(meminfo, "MemTotal"), Some(131_072_000 * 1024));
        assert_eq!(meminfo_bytes(meminfo, "Mem"), None, "a whole name only");
        assert_eq!(meminfo_bytes("MemTotal: 5 kB\n", "MemAvailable"), None);
        assert!(resident_bytes(std::process::id()).is_some_and(|b| b > 0));
    }

    #[test]
    fn command_lines_and_caught_signals() {
        let me = std::process::id();
        assert!(cmdline(me).is_some_and(|c| !c.is_empty() && !c.contains('\0')));
        assert_eq!(cmdline(u32::MAX), None);
        assert!(!catches(me, libc::SIGWINCH), "a test binary does not catch SIGWINCH");
        assert!(!catches(u32::MAX, libc::SIGUSR2));
        assert!(!catches(me, 0) && !catches(me, 65));
    }

    #[test]
    fn stat_state_parsing() {
        assert_eq!(parse_stat_state("123 (sh) S 1 123 123 0 -1"), Some('S'));
        assert_eq!(parse_stat_state("123 (a) b) (c) Z 1 2"), Some('Z'));
        assert_eq!(parse_stat_state("garbage"), None);
        assert_eq!(after_comm("123 (a) b) (c) Z 77 2").and_then(|mut f| f.nth(1)), Some("77"));
    }

    #[test]
    fn this_process_is_alive_and_a_huge_pid_is_not() {
        assert!(is_alive(std::process::id()));
        assert!(exists(std::process::id()));
        assert!(!is_alive(u32::MAX));
        assert!(!exists(u32::MAX));
        assert!(!exists(0));
        // SAFETY: getppid has no preconditions.
        assert_eq!(parent(std::process::id()), Some(unsafe { libc::getppid() } as u32));
        assert_eq!(parent(u32::MAX), None);
    }

    #[test]
    fn descendants_list_children_after_their_root() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().expect("spawn sleep");
        let me = std::process::id();
        let tree = descendants(&[me]);
        assert_eq!(tree[0], me);
        assert!(tree.contains(&child.id()), "{tree:?} lacks the child {}", child.id());
        assert_eq!(descendants(&[child.id()]), [child.id()]);
        child.kill().expect("kill");
        child.wait().expect("wait");
    }

    #[test]
    fn deleted_files_held_open_or_mapped_are_weighed_and_others_not() {
        use std::io::Write;
        let me = std::process::id();
        let dir = tempfile::tempdir().expect("tempdir");
        let kept = dir.path().join("kept");
        std::fs::write(&kept, vec![7u8; 3 << 20]).expect("write");
        let _kept = std::fs::File::open(&kept).expect("open");
        let before = largest_deleted_file(&[me]);
        assert!(before < 3 << 20, "a file still linked is no ghost: {before}");

        let opened = dir.path().join("opened");
        let mut f = std::fs::File::create(&opened).expect("create");
        f.write_all(&vec![1u8; 5 << 20]).expect("write");
        f.sync_all().expect("sync");
        std::fs::remove_file(&opened).expect("remove");
        assert!(largest_deleted_file(&[me]) >= 5 << 20);

        let mapped = dir.path().join("mapped");
        std::fs::write(&mapped, vec![2u8; 9 << 20]).expect("write");
        let len = 9 << 20;
        let file = std::fs::File::open(&mapped).expect("open");
        // SAFETY: a fresh private read-only mapping of a file we opened, unmapped below.
        let map = unsafe {
            use std::os::fd::AsRawFd;
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_PRIVATE, file.as_raw_fd(), 0)
        };
        assert_ne!(map, libc::MAP_FAILED);
        drop(file);
        std::fs::remove_file(&mapped).expect("remove");
        assert!(largest_deleted_file(&[me]) >= 9 << 20, "a mapped file whose descriptor is closed counts");
        // SAFETY: the mapping made above, of `len` bytes.
        unsafe { libc::munmap(map, len) };
    }

    #[test]
    fn tcp_connections_are_told_apart_by_whether_the_tree_holds_their_other_end() {
        use std::io::{BufRead, Write};
        let me = std::process::id();
        let before = tcp_links(&[me]);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        assert_eq!(tcp_links(&[me]), before, "a listening socket is no connection");
        let ours = std::net::TcpStream::connect(listener.local_addr().unwrap()).expect("connect");
        let (theirs, _) = listener.accept().expect("accept");
        let inside = tcp_links(&[me]);
        assert_eq!(inside.connected, before.connected + 2);
        assert_eq!(inside.outside, before.outside, "both ends are this process's");

        // A peer in another process: outside this one, inside the pair.
        let mut child = std::process::Command::new("python3")
            .args([
                "-c",
                "import socket,sys; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(); \
                print(s.getsockname()[1], flush=True); c,_=s.accept(); sys.stdin.read()",
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3");
        let mut port = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut port).expect("port");
        let out = std::net::TcpStream::connect(("127.0.0.1", port.trim().parse::<u16>().unwrap())).expect("connect");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while tcp_links(&[me, child.id()]).connected < inside.connected + 2 {
            assert!(std::time::Instant::now() < deadline, "the child never accepted");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(tcp_links(&[me]).outside, inside.outside + 1);
        assert_eq!(tcp_links(&[me, child.id()]).outside, inside.outside);
        child.stdin.take().unwrap().write_all(b"").expect("close");
        child.wait().expect("wait");
        drop((ours, theirs, out));
    }
}
