//! The CRIU driver: finds a CRIU >= 4.0, runs `criu dump` / `criu restore` with their logs in
//! the image directory, and turns failures into errors that quote the log.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{CriuCause, GpuDumpError, Result};
use crate::{images, procfs};

/// Where [`Criu::find`] looks when no path is given and `criu` is not on `PATH`
/// (scripts/criu.sh installs there).
pub const DEFAULT_CRIU_PATH: &str = "/opt/criu/sbin/criu";
/// The dump log's name inside the image directory.
pub const DUMP_LOG: &str = "dump.log";
/// The restore log's name inside the image directory.
pub const RESTORE_LOG: &str = "restore.log";
/// The file (inside the image directory) where `criu restore` writes the restored pid.
pub const RESTORE_PIDFILE: &str = "restore.pid";

/// How many log lines an error quotes.
const LOG_TAIL_LINES: usize = 15;
/// A line every CRIU run logs on machines without CAP_SYS_RESOURCE in the bounding set; harmless.
const HARMLESS_LINE: &str = "RLIMIT_NOFILE";
/// CRIU's message when an open file's size differs from the dump.
const BAD_SIZE: &str = "has bad size";

/// Options of `criu dump`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DumpOptions {
    /// Keep the process running after the dump (`--leave-running`); otherwise CRIU kills it.
    pub leave_running: bool,
    /// The process is attached to a terminal session (`--shell-job`).
    pub shell_job: bool,
    /// Send the image files to an image streamer listening in the image directory
    /// (`--stream`) instead of writing them there.
    pub stream: bool,
    /// An executable CRIU runs at each action (`--action-script`), e.g. after the image is
    /// complete and before the process is killed or let go (`post-dump`).
    pub action_script: Option<PathBuf>,
    /// The most bytes of a deleted file the process holds that CRIU copies into the image
    /// (`--ghost-limit`); `None` keeps CRIU's default (1 MiB). An `extra_args` one wins.
    pub ghost_limit: Option<u64>,
    /// Further arguments appended to the command line as they are.
    pub extra_args: Vec<String>,
}

/// Options of `criu restore`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestoreOptions {
    /// The image was dumped with `--shell-job`.
    pub shell_job: bool,
    /// Further arguments appended to the command line as they are.
    pub extra_args: Vec<String>,
}

/// A CRIU binary of version 4.0 or newer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Criu {
    path: PathBuf,
    version: String,
}

impl Criu {
    /// Finds CRIU: `explicit` if given, else the first of `criu` on `PATH` and
    /// [`DEFAULT_CRIU_PATH`] that is version 4.0 or newer. Refuses older versions (they fail on
    /// kernels >= 6.13); when every candidate fails, the first one's error is returned.
    pub fn find(explicit: Option<&Path>) -> Result<Criu> {
        if let Some(path) = explicit {
            return Self::probe(path);
        }
        let mut first_error = None;
        for candidate in Self::candidates() {
            match Self::probe(&candidate) {
                Ok(criu) => return Ok(criu),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        Err(first_error
            .unwrap_or_else(|| GpuDumpError::CriuNotFound { tried: format!("criu on PATH, {DEFAULT_CRIU_PATH}") }))
    }

    /// `criu` in each `PATH` directory, then [`DEFAULT_CRIU_PATH`]; only existing files.
    fn candidates() -> Vec<PathBuf> {
        let mut candidates: Vec<PathBuf> = std::env::var_os("PATH")
            .map(|paths| std::env::split_paths(&paths).map(|dir| dir.join("criu")).collect())
            .unwrap_or_default();
        candidates.push(PathBuf::from(DEFAULT_CRIU_PATH));
        candidates.retain(|path| path.is_file());
        candidates.dedup();
        candidates
    }

    /// Runs `path --version` and checks the version.
    fn probe(path: &Path) -> Result<Criu> {
        let path = path.to_path_buf();
        let output = Command::new(&path)
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .map_err(|source| GpuDumpError::CriuSpawn { path: path.clone(), source })?;
        let text = String::from_utf8_lossy(&output.stdout).trim().to_string();
        let Some((version, (major, _, _))) = version_string(&text).and_then(|v| Some((v, parse_version(v)?))) else {
            return Err(GpuDumpError::CriuVersion { path, output: text });
        };
        if major < 4 {
            return Err(GpuDumpError::CriuTooOld { path, version: version.to_string() });
        }
        Ok(Criu { version: version.to_string(), path })
    }

    /// The binary's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The version it reports, e.g. "4.1.1".
    pub fn version(&self) -> String {
        self.version.clone()
    }

    /// Dumps process `pid` (and its descendants) into `dir` (created if missing), logging to
    /// `dir/dump.log`. Without `leave_running` the process is killed once the dump is complete.
    pub fn dump(&self, pid: u32, dir: &Path, opts: &DumpOptions) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| GpuDumpError::io(format!("create {}", dir.display()), e))?;
        let dir = absolute(dir)?;
        let mut args: Vec<String> = vec!["dump".into(), "-t".into(), pid.to_string()];
        args.extend(common_args(&dir, DUMP_LOG));
        if opts.leave_running {
            args.push("--leave-running".into());
        }
        if opts.shell_job {
            args.push("--shell-job".into());
        }
        if opts.stream {
            args.push("--stream".into());
        }
        if let Some(script) = &opts.action_script {
            args.extend(["--action-script".into(), script.display().to_string()]);
        }
        if let Some(limit) = opts.ghost_limit {
            args.extend(["--ghost-limit".into(), limit.to_string()]);
        }
        args.extend(opts.extra_args.iter().cloned());
        self.run("dump", &args, &dir, DUMP_LOG)
    }

    /// Restores the process tree in `dir` detached from this process (it is re-parented to
    /// PID 1 when CRIU exits) and returns the restored root pid, which is the original pid.
    /// Every pid in the image must be free (see [`wait_pid_free`]). Logs to `dir/restore.log`.
    pub fn restore(&self, dir: &Path, opts: &RestoreOptions) -> Result<u32> {
        let dir = absolute(dir)?;
        let pidfile = dir.join(RESTORE_PIDFILE);
        remove_if_present(&pidfile)?;
        let mut args: Vec<String> = vec!["restore".into()];
        args.extend(common_args(&dir, RESTORE_LOG));
        args.extend(["--restore-detached".into(), "--pidfile".into(), pidfile.display().to_string()]);
        if opts.shell_job {
            args.push("--shell-job".into());
        }
        args.extend(opts.extra_args.iter().cloned());
        self.run("restore", &args, &dir, RESTORE_LOG)?;
        let text = std::fs::read_to_string(&pidfile)
            .map_err(|e| GpuDumpError::io(format!("read the restored pid from {}", pidfile.display()), e))?;
        text.trim().parse().map_err(|_| GpuDumpError::Image {
            path: pidfile.clone(),
            detail: format!("CRIU wrote {:?} instead of a pid", text.trim()),
        })
    }

    /// Runs CRIU with `args`. Its stderr (where it reports errors before the log is open) goes
    /// to a scratch file in `dir`, not a pipe: a restored process must not inherit a pipe we
    /// wait on. The file is removed afterwards. Its stdout holds nothing of use (usage text).
    fn run(&self, action: &'static str, args: &[String], dir: &Path, log: &str) -> Result<()> {
        let log = dir.join(log);
        remove_if_present(&log)?;
        let err_path = dir.join(format!(".criu-{action}.stderr"));
        let err = File::create(&err_path).map_err(|e| GpuDumpError::io(format!("create {}", err_path.display()), e))?;
        let status = Command::new(&self.path)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .status()
            .map_err(|source| GpuDumpError::CriuSpawn { path: self.path.clone(), source });
        let output = std::fs::read_to_string(&err_path).unwrap_or_default();
        remove_if_present(&err_path)?;
        let status = status?;
        if status.success() {
            return Ok(());
        }
        let log_text = std::fs::read_to_string(&log).ok();
        Err(GpuDumpError::CriuFailed {
            action,
            status: status.to_string(),
            cause: cause_of(log_text.as_deref().unwrap_or(""), &output),
            details: failure_details(&output, &log, log_text.as_deref()),
        })
    }
}

/// `-D DIR -v2 -o LOG`: images and logs in `dir`, errors and warnings only.
fn common_args(dir: &Path, log: &str) -> [String; 5] {
    ["-D".into(), dir.display().to_string(), "-v2".into(), "-o".into(), log.into()]
}

fn absolute(dir: &Path) -> Result<PathBuf> {
    std::fs::canonicalize(dir).map_err(|e| GpuDumpError::io(format!("image directory {}", dir.display()), e))
}

fn remove_if_present(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(GpuDumpError::io(format!("remove {}", path.display()), e))
        }
        _ => Ok(()),
    }
}

/// The failure CRIU's log or output shows, where it is recognised.
fn cause_of(log: &str, output: &str) -> CriuCause {
    let either = |needle: &str| log.contains(needle) || output.contains(needle);
    if either(BAD_SIZE) {
        CriuCause::FileChangedSize
    } else if either("Can't fork for") && either("File exists") {
        CriuCause::PidTaken
    } else if either("Found dangling tty") || either("Found slave peer index") {
        CriuCause::Terminal
    } else if either("within dumped tree") {
        CriuCause::OwnAncestor
    } else if either("doesn't have a proper root mount") {
        CriuCause::Container
    } else if either("Can't get 1:16 opt: Operation not supported") {
        CriuCause::SocketOptions
    } else if either("Connected TCP socket") {
        CriuCause::TcpEstablished
    } else if either("Can't dump ghost file") {
        CriuCause::GhostLimit
    } else if either("anon_inode:[io_uring]") {
        CriuCause::IoUring
    } else {
        CriuCause::Unknown
    }
}

/// A CRIU log line without its leading `(00.012345) ` timestamp: lines that differ in that
/// only say the same thing again.
fn criu_message(line: &str) -> &str {
    let line = line.trim_start();
    match line.strip_prefix('(').and_then(|rest| rest.split_once(") ")) {
        Some((stamp, rest)) if stamp.bytes().all(|b| b.is_ascii_digit() || b == b'.') => rest,
        _ => line,
    }
}

/// CRIU's own output and the end of its log, without the harmless RLIMIT line.
fn failure_details(output: &str, log: &Path, log_text: Option<&str>) -> String {
    let mut details = String::new();
    let output = tail(output, LOG_TAIL_LINES);
    if !output.is_empty() {
        details.push_str(&format!("criu said:\n{output}\n"));
    }
    // Named by its file name: the image directory is often a staging directory removed
    // before the message is read (a kept copy, if any, is named by the caller).
    let name = log.file_name().map_or_else(|| log.display().to_string(), |n| n.to_string_lossy().into_owned());
    match log_text {
        Some(text) => {
            let text = tail(text, LOG_TAIL_LINES);
            if text.is_empty() {
                details.push_str(&format!("CRIU's {name} holds nothing but harmless lines"));
            } else {
                details.push_str(&format!("last lines of CRIU's {name}:\n{text}"));
            }
        }
        None => details.push_str(&format!("no {name} from CRIU (it stopped before writing it)")),
    }
    details
}

/// The last `n` non-empty lines of `text`, leaving out the harmless RLIMIT_NOFILE line and
/// a line that only repeats the one before it (CRIU says some things once per thread).
fn tail(text: &str, n: usize) -> String {
    let mut lines: Vec<&str> =
        text.lines().map(str::trim_end).filter(|line| !line.is_empty() && !line.contains(HARMLESS_LINE)).collect();
    lines.dedup_by(|later, earlier| criu_message(later) == criu_message(earlier));
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The version word of `criu --version` output ("Version: 4.1.1" → "4.1.1").
fn version_string(output: &str) -> Option<&str> {
    output.lines().find_map(|line| line.trim().strip_prefix("Version:")).map(str::trim).filter(|v| !v.is_empty())
}

/// Parses "X.Y" or "X.Y.Z" (any suffix after the numbers is ignored, e.g. "4.2-rc1" → 4.2.0).
pub fn parse_version(version: &str) -> Option<(u32, u32, u32)> {
    let mut parts = version.trim().split('.').map(|part| {
        let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
        digits.parse::<u32>().ok()
    });
    let major = parts.next()??;
    let minor = parts.next()??;
    let patch = parts.next().flatten().unwrap_or(0);
    Some((major, minor, patch))
}

/// Waits until no process (not even a zombie) holds `pid`. After a dump kills a task, PID 1
/// reaps it about a second later, and CRIU cannot restore a pid that is still taken.
pub fn wait_pid_free(pid: u32, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while procfs::exists(pid) {
        if Instant::now() >= deadline {
            return Err(GpuDumpError::PidInUse { pid, timeout });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The ids recorded in an image's process tree (`pstree.img`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageTree {
    /// Every pid and thread id, sorted, each once: a restore needs all of them free, not just
    /// the root's.
    pub ids: Vec<u32>,
    /// The processes' pids (not their other threads), in the tree's order.
    pub processes: Vec<u32>,
}

/// The process tree recorded in image `dir`, read once.
pub fn image_tree(dir: &Path) -> Result<ImageTree> {
    let path = dir.join("pstree.img");
    let bytes = std::fs::read(&path).map_err(|e| GpuDumpError::io(format!("read {}", path.display()), e))?;
    let tree = images::parse_pstree(&bytes).map_err(|detail| GpuDumpError::Image { path, detail })?;
    let processes = tree.iter().map(|p| p.pid).collect();
    let mut ids: Vec<u32> = tree.into_iter().flat_map(|p| std::iter::once(p.pid).chain(p.threads)).collect();
    ids.sort_unstable();
    ids.dedup();
    Ok(ImageTree { ids, processes })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_parsing() {
        assert_eq!(version_string("Version: 4.1.1\n"), Some("4.1.1"));
        assert_eq!(version_string("Version: 3.17.1\nGitID: v3.17.1\n"), Some("3.17.1"));
        assert_eq!(version_string("criu 4.1\n"), None);
        assert_eq!(version_string("Version:   \n"), None);
        assert_eq!(parse_version("4.1.1"), Some((4, 1, 1)));
        assert_eq!(parse_version("4.2"), Some((4, 2, 0)));
        assert_eq!(parse_version("4.2-rc1"), Some((4, 2, 0)));
        assert_eq!(parse_version("3.17.1"), Some((3, 17, 1)));
        assert_eq!(parse_version("4"), None);
        assert_eq!(parse_version("x.y"), None);
        assert_eq!(parse_version(""), None);
    }

    #[test]
    fn find_refuses_old_criu_and_explains_why() {
        let err = Criu::find(Some(crate::testutil::fake_criu_3_17())).expect_err("3.17 is too old");
        let msg = err.to_string();
        assert!(matches!(err, GpuDumpError::CriuTooOld { .. }), "{err:?}");
        assert!(msg.contains("CRIU 3.17.1") && msg.contains(">= 4.0"), "{msg}");
        assert!(msg.contains("vDSO") && msg.contains("6.13") && msg.contains("scripts/criu.sh"), "{msg}");
    }

    #[test]
    fn find_accepts_new_criu_and_rejects_garbage() {
        let new = crate::testutil::fake_criu_4_2();
        let criu = Criu::find(Some(new)).expect("4.2 is fine");
        assert_eq!(criu.version(), "4.2");
        assert_eq!(criu.path(), new);
        let err = Criu::find(Some(crate::testutil::fake_criu_garbage())).expect_err("no version line");
        assert!(err.to_string().contains("no \"Version: X.Y\" line"), "{err}");
        let err = Criu::find(Some(Path::new("/nonexistent/criu"))).expect_err("missing binary");
        assert!(err.to_string().starts_with("could not run /nonexistent/criu"), "{err}");
    }

    #[test]
    fn log_tail_skips_the_harmless_line_and_keeps_the_end() {
        let mut log = String::from(
            "Error (criu/util.c:1533): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted\n",
        );
        for i in 0..30 {
            log.push_str(&format!("line {i}\n"));
        }
        let tail = tail(&log, LOG_TAIL_LINES);
        assert!(!tail.contains("RLIMIT"));
        assert_eq!(tail.lines().count(), 15);
        assert!(tail.starts_with("line 15") && tail.ends_with("line 29"), "{tail}");
    }

    #[test]
    fn bad_size_and_pid_collisions_are_explained() {
        let log = "Error (criu/files-reg.c:2179): File tmp/out.txt has bad size 182 (expect 152)\n";
        assert_eq!(cause_of(log, ""), CriuCause::FileChangedSize);
        assert!(CriuCause::FileChangedSize.to_string().contains("changed size after the dump"));
        let log = "Error (criu/cr-restore.c:1460): Can't fork for 4242: File exists\n";
        assert_eq!(cause_of(log, ""), CriuCause::PidTaken);
        assert_eq!(cause_of("Error: something else", ""), CriuCause::Unknown);
        assert_eq!(CriuCause::Unknown.to_string(), "");
        let log = "Error (criu/tty.c:2115): tty: Found dangling tty with sid 1 pgid 2 (pts) on peer fd 0.\n";
        assert!(cause_of(log, "").to_string().contains("--shell-job"));
        let slave =
            "(00.004) Error (criu/tty.c:1019): tty: Found slave peer index 2 without correspondent master peer\n";
        assert_eq!(cause_of(slave, ""), CriuCause::Terminal);
        let own: String = (0..6)
            .map(|i| format!("(00.00{i}) Error (criu/seize.c:22): The criu itself is within dumped tree.\n"))
            .collect();
        assert_eq!(cause_of(&own, ""), CriuCause::OwnAncestor);
        assert_eq!(tail(&own, 10).lines().count(), 1, "a line once per thread is said once");
        let log = "Error (criu/mount.c:1009): mnt: ./sys/fs/cgroup/systemd doesn't have a proper root mount\n";
        assert!(cause_of(log, "").to_string().contains("container"));
        let log = "(00.046) Error (criu/sockets.c:628): sockets: Can't get 1:16 opt: Operation not supported\n";
        assert!(cause_of(log, "").to_string().contains("CRIU >= 4.2"));
        let log = "(00.012) Error (criu/sk-inet.c:200): inet: Connected TCP socket, consider using --tcp-established option.\n";
        assert!(cause_of(log, "").to_string().contains("--criu-opt=--tcp-established"));
        let log = "(00.031) Error (criu/sk-inet.c:912): inet: Connected TCP socket in image\n";
        assert_eq!(cause_of(log, ""), CriuCause::TcpEstablished);
        let log = "(00.020) Error (criu/files-reg.c:1031): Can't dump ghost file /dev/shm/nccl-x of 34213888 size, increase limit\n";
        assert!(cause_of(log, "").to_string().contains("--ghost-limit"));
        let log = "(00.050) Error (criu/proc_parse.c:502): Unknown shit 600 (anon_inode:[io_uring])\n";
        assert!(cause_of(log, "").to_string().contains("USE_LIBUV=0"));
        let details = failure_details("criu: unrecognized option '--x'\n", Path::new("/img/dump.log"), None);
        assert!(details.contains("unrecognized option") && details.contains("no dump.log from CRIU"), "{details}");
        assert!(!details.contains("/img"), "the image directory may be gone when this is read: {details}");
    }

    #[test]
    fn image_tree_lists_every_pid_and_thread_once_and_the_processes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut img = Vec::new();
        img.extend(images::IMG_COMMON_MAGIC.to_le_bytes());
        img.extend(images::PSTREE_MAGIC.to_le_bytes());
        // pid 300 with threads 300, 301; child 200 with thread 200.
        for rec in
            [vec![0x08, 0xac, 0x02, 0x28, 0xac, 0x02, 0x28, 0xad, 0x02], vec![0x08, 0xc8, 0x01, 0x28, 0xc8, 0x01]]
        {
            img.extend((rec.len() as u32).to_le_bytes());
            img.extend(rec);
        }
        std::fs::write(dir.path().join("pstree.img"), &img).expect("write");
        let tree = image_tree(dir.path()).expect("parse");
        assert_eq!(tree.ids, vec![200, 300, 301]);
        assert_eq!(tree.processes, vec![300, 200]);
        let err = image_tree(Path::new("/nonexistent")).expect_err("no image");
        assert!(err.to_string().contains("/nonexistent/pstree.img"), "{err}");
    }

    #[test]
    fn wait_for_a_taken_pid_times_out_with_a_clear_error() {
        let me = std::process::id();
        let err = wait_pid_free(me, Duration::from_millis(50)).expect_err("our own pid is taken");
        assert!(err.to_string().starts_with(&format!("pid {me} is still in use by another process")), "{err}");
        wait_pid_free(u32::MAX, Duration::ZERO).expect("a pid above pid_max is free");
    }
}
