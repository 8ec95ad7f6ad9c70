//! Small `/proc` queries about processes.

/// The state letter of process `pid` from `/proc/PID/stat` (`R`, `S`, `Z`, ...), or `None`
/// when there is no such process.
pub fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_state(&stat)
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

/// The state letter of a `/proc/PID/stat` line: the first field after the `(comm)`, which
/// may itself contain spaces and parentheses.
fn parse_stat_state(stat: &str) -> Option<char> {
    let (_, after_comm) = stat.rsplit_once(')')?;
    after_comm.trim_start().chars().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_state_parsing() {
        assert_eq!(parse_stat_state("123 (sh) S 1 123 123 0 -1"), Some('S'));
        assert_eq!(parse_stat_state("123 (a) b) (c) Z 1 2"), Some('Z'));
        assert_eq!(parse_stat_state("garbage"), None);
    }

    #[test]
    fn this_process_is_alive_and_a_huge_pid_is_not() {
        assert!(is_alive(std::process::id()));
        assert!(exists(std::process::id()));
        assert!(!is_alive(u32::MAX));
        assert!(!exists(u32::MAX));
        assert!(!exists(0));
    }
}
