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
}
