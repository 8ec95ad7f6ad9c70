//! Command-line arguments.

use crate::units;
use clap::{Args, Parser, Subcommand};
use gstore_gpu_dump::GpuMap;
use std::path::PathBuf;

/// gstore: a content-addressed, deduplicated checkpoint store.
#[derive(Parser, Debug)]
#[command(name = "gstore", version, about, long_about = None)]
pub struct Cli {
    /// Store location: a directory, s3://BUCKET[/PREFIX] or http://HOST:PORT. Default:
    /// $XDG_DATA_HOME/gstore, else ~/.local/share/gstore.
    #[arg(long, global = true, env = "GSTORE_STORE", value_name = "PATH")]
    pub store: Option<String>,
    /// Print machine-readable JSON on stdout (and no progress bars).
    #[arg(long, global = true)]
    pub json: bool,
    /// No progress bars.
    #[arg(long, short, global = true)]
    pub quiet: bool,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create a new, empty store.
    Init(InitArgs),
    /// Store a file or directory tree (e.g. a CRIU image dir) as a tagged image. A container
    /// checkpoint archive (podman's `--export`, the kubelet's; tar, tar.gz or tar.zst) is
    /// stored entry by entry, as is any tar read from standard input (`-`).
    Push {
        /// File or directory to store, or `-` for a tar archive on standard input.
        path: PathBuf,
        /// Tag for the image: NAME or NAME:VERSION (VERSION defaults to "latest").
        #[arg(long, short)]
        tag: String,
        /// Extra metadata recorded in the manifest, KEY=VALUE (repeatable).
        #[arg(long = "meta", value_name = "KEY=VALUE")]
        meta: Vec<String>,
        /// Leave out entries matching this glob (repeatable), matched against paths in the
        /// image, e.g. '*.log' or 'cache'; a matching directory leaves out all below it.
        #[arg(long, value_name = "GLOB")]
        exclude: Vec<String>,
        /// Read and chunk everything and say what the push would add; write nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Restore an image (by tag or manifest id) into a new or empty directory, or with --run
    /// restore a checkpointed process and start it.
    #[command(group(clap::ArgGroup::new("starts").args(["run", "container"])))]
    Restore {
        /// NAME[:VERSION], or an image id (8 or more of its hex digits, as `gstore ls` shows them).
        image: String,
        /// Destination directory (created; must not exist or be empty). With --run: where the
        /// process image is written and kept (default: a temporary directory, removed after);
        /// a lazy restore's pages-N.img files there hold only the pages CRIU read itself.
        #[arg(long, required_unless_present_any = ["run", "container", "archive"])]
        to: Option<PathBuf>,
        /// Write the image as a plain tar archive to FILE (`-`: standard output), as
        /// `podman container restore --import` takes a container checkpoint archive.
        #[arg(long, value_name = "FILE", conflicts_with_all = ["to", "run", "container"])]
        archive: Option<PathBuf>,
        /// Restore a container checkpoint (from `gstore checkpoint --container` or a pushed
        /// checkpoint archive) into podman, after checking that this machine can (podman,
        /// CRIU, the base image present, the name free).
        #[arg(long, conflicts_with_all = ["to", "run"])]
        container: bool,
        /// With --container: the restored container's name (default: the checkpointed one).
        #[arg(long, requires = "container", value_name = "NAME", value_parser = container_name)]
        name: Option<String>,
        /// With --container: the runtime to restore it through, which must be the one it was
        /// checkpointed through (the default).
        #[arg(long, value_enum, requires = "container")]
        runtime: Option<RuntimeArg>,
        /// Restore a process checkpoint (from `gstore checkpoint`) and start it, detached.
        #[arg(long)]
        run: bool,
        /// Restore only the entries matching this glob (repeatable), e.g. 'config/*.json'; a
        /// matching directory brings everything below it. Not with --run.
        #[arg(long, value_name = "GLOB", conflicts_with = "run")]
        include: Vec<String>,
        /// Leave out the entries matching this glob (repeatable), after --include.
        #[arg(long, value_name = "GLOB", conflicts_with = "run")]
        exclude: Vec<String>,
        /// With --to: a directory this machine already holds, e.g. an earlier restore of the
        /// same model or checkpoint (repeatable). Its files are cut and hashed as a push would,
        /// and every chunk of the image found there (any file, any offset) is copied from it,
        /// checked against its id, instead of fetched; the seed is only read.
        #[arg(long, value_name = "DIR", conflicts_with_all = ["run", "container", "archive"])]
        seed: Vec<PathBuf>,
        /// With --run: seconds to wait for the image's pid to be free.
        #[arg(long, default_value_t = 10, requires = "run")]
        pid_wait: u64,
        /// With --run (or --container, for a runc container): write the whole image out before
        /// CRIU starts instead of serving the process's memory from the store while it runs
        /// (the default where this machine's userfaultfd allows it; podman restores eagerly).
        #[arg(long, requires = "starts")]
        no_lazy: bool,
        /// With --run: restore the image's GPUs onto these, OLD=NEW[,OLD=NEW...], each an index
        /// or a UUID (GPU-…, as `nvidia-smi -L` shows it); only the GPUs named are restored.
        /// Without it each GPU goes back to the GPU with its UUID, else to the lowest free GPU
        /// of the same model with enough memory. Remapping needs a CUDA 13 (580+) driver.
        #[arg(long, requires = "run", value_name = "OLD=NEW,...", value_parser = GpuMap::parse)]
        gpu_map: Option<GpuMap>,
        /// CRIU options (with --run).
        #[command(flatten)]
        criu: CriuArgs,
        /// Bytes the restore may hold in flight, e.g. 512MiB or 2G.
        #[arg(long, default_value = "1GiB", value_name = "SIZE", value_parser = units::size)]
        memory_budget: u64,
    },
    /// Checkpoint a running process (GPU state included), or a container through its
    /// runtime, into the store.
    Checkpoint {
        /// The process to checkpoint (with its children).
        #[arg(long, required_unless_present = "container")]
        pid: Option<u32>,
        /// The container to checkpoint (name or id), through podman (its checkpoint archive
        /// streams into the store entry by entry, never landing on disk) or runc (its GPU
        /// processes checkpointed through the CUDA driver around runc's dump).
        #[arg(long, value_name = "NAME|ID", conflicts_with_all = ["pid", "staging", "shell_job", "criu_opts"])]
        container: Option<String>,
        /// With --container: the runtime to checkpoint it through. Default: podman where it is
        /// installed and knows the container, else runc.
        #[arg(long, value_enum, requires = "container")]
        runtime: Option<RuntimeArg>,
        /// Tag for the image: NAME or NAME:VERSION.
        #[arg(long, short)]
        tag: String,
        /// Keep the process running: it runs on as soon as CRIU has dumped it (its GPU state
        /// resumed), while the image is still being stored. Without it the process ends once
        /// its image is stored and tagged (and runs on if storing fails).
        #[arg(long)]
        leave_running: bool,
        /// How long (ms) to wait for the CUDA lock (0: no limit).
        #[arg(long, default_value_t = 10_000, value_name = "MS")]
        lock_timeout: u32,
        /// Write the CRIU image into DIR first and push it from there (by default it streams
        /// from CRIU straight into the store). If that push fails after CRIU ended the
        /// process, the process is restored from DIR.
        #[arg(long, value_name = "DIR")]
        staging: Option<PathBuf>,
        /// CRIU options.
        #[command(flatten)]
        criu: CriuArgs,
    },
    /// Restore an image's files straight into memory (host, or GPU memory with cuda:N) and
    /// report the throughput.
    Load {
        /// NAME[:VERSION], or an image id (8 or more of its hex digits, as `gstore ls` shows them).
        image: String,
        /// Where to: host; cuda:N for GPU N; several GPUs as cuda:0,cuda:1,...; or all (every
        /// GPU). Several GPUs load in parallel, each file whole on one of them (about the same
        /// bytes on each), or every file on each with --replicate.
        #[arg(long, default_value = "host")]
        device: String,
        /// Read device buffers back afterwards and check every chunk's hash.
        #[arg(long)]
        check: bool,
        /// With several GPUs: load the whole image onto each, instead of splitting its files.
        #[arg(long)]
        replicate: bool,
        /// Bytes the restore may hold in flight, pinned staging included, e.g. 512MiB or 2G.
        #[arg(long, default_value = "1GiB", value_name = "SIZE", value_parser = units::size)]
        memory_budget: u64,
        /// Load from the `gstore hold` answering at this socket (one GPU, cuda:N): it holds
        /// the image in pinned memory and checks every chunk on the GPU.
        #[arg(long, value_name = "SOCKET", conflicts_with = "replicate")]
        held: Option<PathBuf>,
    },
    /// Hold images in pinned host memory and load them into other processes' GPU memory on
    /// request (`gstore load IMAGE --device cuda:N --held SOCKET`, or `Store.load(...,
    /// held=SOCKET)` in Python): such loads read no file and copy nothing on the host, and
    /// every chunk is still checked on the GPU. Runs until stopped (Ctrl-C, SIGTERM).
    Hold {
        /// Images to hold: NAME[:VERSION] or image ids (8 or more hex digits). Loads name
        /// them the same way, or by id.
        #[arg(required = true)]
        images: Vec<String>,
        /// The Unix socket loads arrive at (made readable by this user alone).
        #[arg(long, value_name = "PATH")]
        socket: PathBuf,
        /// The GPU loads go to: cuda:N.
        #[arg(long, default_value = "cuda:0")]
        device: String,
        /// Sets the size of range reads as for `gstore load` (up to 16 MiB); the held images
        /// take their stored size in pinned memory besides.
        #[arg(long, default_value = "1GiB", value_name = "SIZE", value_parser = units::size)]
        memory_budget: u64,
    },
    /// List tags with their images' ids, sizes and creation times.
    Ls {
        /// Only tags with this name (all versions), one tag (NAME:VERSION), or names that
        /// start with it when it ends in `*`.
        name: Option<String>,
        /// Order of the rows.
        #[arg(long, value_enum, default_value_t = Sort::Name)]
        sort: Sort,
        /// Only the newest image of each name.
        #[arg(long)]
        latest: bool,
    },
    /// A tag's history: every value it had, newest first (all versions of NAME, or one
    /// NAME:VERSION). Roll back with `gstore tag ID NAME:VERSION`.
    Log {
        /// NAME or NAME:VERSION.
        tag: String,
    },
    /// Which files differ between two images, and how many bytes each adds to the other.
    Diff {
        /// The first image: NAME[:VERSION] or an image id.
        a: String,
        /// The second image.
        b: String,
    },
    /// Copy tagged images to another store (local, s3:// or http://), sending only the chunks
    /// it lacks; the tags are set there too.
    Copy {
        /// NAME[:VERSION] (one or more).
        #[arg(required = true)]
        images: Vec<String>,
        /// The target store.
        #[arg(long, value_name = "STORE")]
        to: String,
    },
    /// Write one file of an image to stdout (every chunk checked).
    Cat {
        /// NAME[:VERSION], or an image id (8 or more hex digits).
        image: String,
        /// The file's path in the image, as `gstore show` lists it.
        path: String,
    },
    /// Show one image: metadata, entries, sizes and chunk counts.
    Show {
        /// NAME[:VERSION], or an image id (8 or more of its hex digits, as `gstore ls` shows them).
        image: String,
    },
    /// Space used: logical and stored bytes, dedup and compression ratios, bytes unique to each image.
    Du {
        /// Also the space used by the images whose tag names start with this (a token's
        /// namespace: what a quota on it bounds); repeatable.
        #[arg(long = "prefix", value_name = "PREFIX")]
        prefixes: Vec<String>,
    },
    /// Point a new tag at an existing image.
    Tag {
        /// Existing NAME[:VERSION], or an image id (8 or more hex digits): `gstore log` lists a tag's earlier ids, so this rolls a tag back.
        source: String,
        /// New NAME[:VERSION] (an existing tag is moved; its old value goes to history).
        target: String,
    },
    /// Pin tags: gc's retention (--keep-last, --keep-daily, ...) never removes a pinned tag
    /// or its current image; a push or `gstore tag` that moves it keeps it pinned.
    Pin {
        /// NAME[:VERSION] (one or more).
        #[arg(required = true)]
        tags: Vec<String>,
    },
    /// Unpin tags (`gstore pin`): retention treats them as any other again.
    Unpin {
        /// NAME[:VERSION] (one or more).
        #[arg(required = true)]
        tags: Vec<String>,
    },
    /// Remove a tag (its chunks stay until garbage collection).
    Rm {
        /// NAME[:VERSION] (one or more).
        #[arg(required = true)]
        images: Vec<String>,
    },
    /// Reclaim space safely while others push: apply retention (if asked), then mark-and-sweep
    /// passes back to back. Unneeded packs and manifests are tombstoned by one pass and deleted
    /// by the next, so one run gets the space back; the old copy of a pack the run rewrote
    /// waits for the next run (restores planned before it may read it) unless
    /// --reclaim-copies. See docs/GC.md.
    Gc(GcArgs),
    /// Check every tagged image: manifests, packs, and with --read-data every chunk's bytes.
    /// An encrypted store with no key in the environment (GSTORE_KEY_FILE, GSTORE_PASSPHRASE)
    /// and no --read-data is checked without its key: key records and the framing of every
    /// sealed object.
    Verify {
        /// Read, decode and hash every referenced chunk.
        #[arg(long)]
        read_data: bool,
    },
    /// Serve the store over HTTP for `--store http://HOST:PORT` clients (docs/HTTP.md).
    Serve(ServeArgs),
    /// Store each container checkpoint archive that lands in a directory (the kubelet's
    /// /var/lib/kubelet/checkpoints), entry by entry once it is complete, tagged by pod,
    /// container and time; a node agent (docs/CONTAINERS.md). Runs until stopped, or with
    /// --once until what is there is stored. Prints a line per archive (JSON with --json).
    Watch {
        /// The directory archives land in (`checkpoint-*.tar`, `.tar.gz`, `.tar.zst`).
        dir: PathBuf,
        /// What each tag name starts with, e.g. the node's name.
        #[arg(long, default_value = "k8s-")]
        prefix: String,
        /// Remove each archive once it is stored.
        #[arg(long)]
        remove: bool,
        /// Store what is there now, then exit (1 if any archive failed).
        #[arg(long)]
        once: bool,
        /// Seconds between looks at the directory.
        #[arg(long, default_value_t = 2)]
        interval: u64,
        /// Seconds an archive must be unchanged before it is taken in (for writers that write
        /// under the final name).
        #[arg(long, default_value_t = 2)]
        settle: u64,
        /// Write Prometheus metrics to this file after each archive (a node exporter's
        /// textfile collector reads it).
        #[arg(long, value_name = "FILE")]
        metrics: Option<PathBuf>,
    },
    /// Version, build and platform details.
    Version,
    /// Print a shell completion script, e.g. `gstore completions bash > /etc/bash_completion.d/gstore`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write man pages (gstore.1 and one per command) into a directory.
    Man {
        /// Where to write them (created).
        dir: PathBuf,
    },
    /// Maintain the local index.
    Index {
        /// What to do.
        #[command(subcommand)]
        action: IndexAction,
    },
    /// Retention policies stored in the store, per tag name or name prefix (`NAME*`): `gstore
    /// gc` applies them without being told; names without one go by gc's own flags. Pinned
    /// tags are always kept. See docs/GC.md.
    Policy {
        /// What to do.
        #[command(subcommand)]
        action: PolicyAction,
    },
    /// Manage the user keys of an encrypted store (`gstore init --encrypt`): every key opens
    /// the same store; adding or removing one rewrites no data. The current key comes from
    /// GSTORE_KEY_FILE, GSTORE_PASSPHRASE or a prompt.
    Key {
        /// What to do.
        #[command(subcommand)]
        action: KeyAction,
    },
}

/// `gstore policy` subcommands.
#[derive(Subcommand, Debug)]
pub enum PolicyAction {
    /// Store the rules for a tag name, or for every name starting with a prefix (`run-*`; `*`
    /// alone: every name), replacing its previous rules.
    Set {
        /// A tag name, or a name prefix followed by `*`.
        pattern: String,
        /// The rules (at least one).
        #[command(flatten)]
        rules: RuleArgs,
    },
    /// List the stored policies.
    Show,
    /// Remove the policy of a pattern (its names go by gc's flags again).
    Rm {
        /// The pattern, as `gstore policy show` lists it.
        pattern: String,
    },
}

/// `gstore key` subcommands.
#[derive(Subcommand, Debug)]
pub enum KeyAction {
    /// Write a new random key file (64 hex digits, mode 0600) for GSTORE_KEY_FILE; refuses to
    /// overwrite a file.
    Generate {
        /// The file to write.
        file: PathBuf,
    },
    /// List the store's key records.
    List,
    /// Add a user key: the key file given, else GSTORE_NEW_PASSPHRASE, else a passphrase
    /// asked for twice.
    Add {
        /// A key file (64 hex digits from `gstore key generate`, or a passphrase).
        #[arg(long, value_name = "FILE")]
        new_key_file: Option<PathBuf>,
    },
    /// Remove a key record (by its id, as `gstore key list` shows it); the last one is never
    /// removed.
    Remove {
        /// The record's id.
        id: String,
    },
}

/// The container runtime of `--container`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuntimeArg {
    /// podman.
    Podman,
    /// runc itself (containers run by runc, without podman).
    Runc,
}

/// How `gstore ls` orders its rows.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sort {
    /// By tag (name, then version).
    Name,
    /// Newest image first.
    Time,
    /// Largest image first.
    Size,
}

/// How to run CRIU.
#[derive(Args, Debug)]
pub struct CriuArgs {
    /// The criu binary (>= 4.0). Default: `criu` on PATH, else /opt/criu/sbin/criu.
    #[arg(long, value_name = "PATH")]
    pub criu: Option<PathBuf>,
    /// An extra argument for `criu dump` / `criu restore` (repeatable), e.g. --criu-opt=--tcp-established.
    #[arg(long = "criu-opt", value_name = "ARG", allow_hyphen_values = true)]
    pub criu_opts: Vec<String>,
    /// The process is attached to a terminal session (CRIU --shell-job).
    #[arg(long)]
    pub shell_job: bool,
}

/// `gstore index` actions.
#[derive(Subcommand, Debug)]
pub enum IndexAction {
    /// Rebuild the local index from the pack footers in the store (the restore plans
    /// recorded beside it go too).
    Rebuild,
}

/// `gstore init` settings (fixed for the life of the store).
#[derive(Args, Debug)]
pub struct InitArgs {
    /// FastCDC minimum chunk size.
    #[arg(long, default_value = "16KiB", value_name = "SIZE", value_parser = units::size_u32)]
    pub chunk_min: u32,
    /// FastCDC average chunk size.
    #[arg(long, default_value = "64KiB", value_name = "SIZE", value_parser = units::size_u32)]
    pub chunk_avg: u32,
    /// FastCDC maximum chunk size.
    #[arg(long, default_value = "256KiB", value_name = "SIZE", value_parser = units::size_u32)]
    pub chunk_max: u32,
    /// zstd level for chunks that compress (1-19).
    #[arg(long, default_value_t = 1)]
    pub zstd_level: i32,
    /// Target pack size.
    #[arg(long, default_value = "48MiB", value_name = "SIZE", value_parser = units::size)]
    pub pack_size: u64,
    /// Never use the byte-grouped float codec (codec 3): chunks are stored zstd or raw only,
    /// as gstore before it wrote them (older readers refuse float-coded chunks).
    #[arg(long)]
    pub no_float_codec: bool,
    /// Keep the float codec's compressible lanes as zstd frames (lane codec 1), as gstore
    /// before Huffman lanes wrote them (older readers refuse Huffman lanes, lane codec 2). GPU
    /// loads then decode those lanes on the host (or with nvCOMP when GSTORE_NVCOMP names it).
    #[arg(long)]
    pub zstd_lanes: bool,
    /// Keep a chunk compressed only when that saves at least PERCENT of its bytes; store it
    /// raw otherwise. Restores and lazy fills copy raw chunks instead of decoding them: a higher
    /// value trades stored bytes for restores that cost less CPU (docs/BENCHMARKS.md, "Cheaper
    /// fills").
    #[arg(long, default_value_t = 3, value_name = "PERCENT", value_parser = clap::value_parser!(u8).range(0..=100))]
    pub min_saving: u8,
    /// Encrypt the store (docs/SECURITY.md): its first key comes from GSTORE_KEY_FILE or
    /// GSTORE_PASSPHRASE, else a passphrase asked for twice.
    #[arg(long)]
    pub encrypt: bool,
}

/// Retention rules, of `gstore gc` and of stored policies (`gstore policy set`).
#[derive(Args, Debug)]
pub struct RuleArgs {
    /// Keep the newest N images of each tag name (its versions and their history together);
    /// remove the rest.
    #[arg(long, value_name = "N")]
    pub keep_last: Option<usize>,
    /// Keep every image set within this long before now, e.g. 7d, 12h, 90min. An image any
    /// rule keeps is kept.
    #[arg(long, value_name = "DUR", value_parser = humantime::parse_duration)]
    pub keep_within: Option<std::time::Duration>,
    /// Keep the newest image of each of the newest N UTC days that have images of a name.
    #[arg(long, value_name = "N")]
    pub keep_daily: Option<usize>,
    /// Keep the newest image of each of the newest N UTC weeks (Monday to Sunday) that have
    /// images of a name.
    #[arg(long, value_name = "N")]
    pub keep_weekly: Option<usize>,
}

impl RuleArgs {
    /// The rules, for the names starting with `prefix` (all names without one).
    pub fn policy(&self, prefix: Option<String>) -> gstore_store::commands::gc::retention::Policy {
        gstore_store::commands::gc::retention::Policy {
            keep_last: self.keep_last,
            keep_within_secs: self.keep_within.map(|d| d.as_secs()),
            keep_daily: self.keep_daily,
            keep_weekly: self.keep_weekly,
            prefix,
        }
    }
}

/// Arguments of `gstore gc`.
#[derive(Args, Debug)]
#[command(group = clap::ArgGroup::new("retention").multiple(true).args(["keep_last", "keep_within", "keep_daily", "keep_weekly"]))]
pub struct GcArgs {
    /// The retention rules for names without a stored policy (`gstore policy`).
    #[command(flatten)]
    pub rules: RuleArgs,
    /// Apply the retention rules only to tag names starting with this (e.g. one training
    /// run's); other names keep everything. Pinned tags (`gstore pin`) are always kept.
    #[arg(long, value_name = "PREFIX", requires = "retention")]
    pub prefix: Option<String>,
    /// Report what would be removed and reclaimed; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Rewrite packs whose live data is below this fraction of their chunk data (0: never).
    #[arg(long, default_value_t = gstore_store::commands::gc::DEFAULT_REPACK_BELOW, value_name = "FRACTION")]
    pub repack_below: f64,
    /// Take the gc lock from a gc this machine cannot prove dead. Only when it is dead.
    #[arg(long)]
    pub break_lock: bool,
    /// Also delete, in this run, tombstoned packs that hold copies of live chunks (the old
    /// copies of packs it rewrote): all the space comes back at once, but a restore that
    /// started before this run and still reads such a pack stops ("pack not found"; run it
    /// again). Without it the next run deletes them.
    #[arg(long)]
    pub reclaim_copies: bool,
}

/// `gstore serve` settings.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on: IP:PORT or HOST:PORT.
    #[arg(long, default_value = "127.0.0.1:8420", value_parser = units::listen_addr)]
    pub listen: std::net::SocketAddr,
    /// Token file: `TOKEN SCOPE [TAG_PREFIX]` lines, SCOPE read, write or admin.
    #[arg(long, value_name = "FILE")]
    pub tokens: Option<PathBuf>,
    /// Allow a non-loopback address without tokens.
    #[arg(long)]
    pub insecure: bool,
    /// Largest request body (a pack upload).
    #[arg(long, default_value = "256MiB", value_name = "SIZE", value_parser = units::size_usize)]
    pub max_body: usize,
    /// Seconds before a request is answered 408.
    #[arg(long, default_value_t = 300, value_name = "SECS")]
    pub timeout: u64,
    /// Seconds a connection has to send a request's headers (and a TLS handshake to end)
    /// before it is closed, idle connections between requests included.
    #[arg(long, default_value_t = 10, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    pub header_timeout: u64,
    /// Requests handled at once.
    #[arg(long, default_value_t = 256)]
    pub max_concurrent: usize,
    /// Serve HTTPS with this certificate chain (PEM); needs --tls-key.
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Serve as a caching tier: keep the pack ranges clients read in this directory (each
    /// read from the store once, checked chunk by chunk, and served from here after), for
    /// many restore nodes reading one image from a remote store at once.
    #[arg(long, value_name = "DIR")]
    pub cache: Option<PathBuf>,
    /// The most bytes of pack ranges --cache keeps (least recently used go first).
    #[arg(long, default_value = "8GiB", value_name = "SIZE", value_parser = units::size, requires = "cache")]
    pub cache_bytes: u64,
    /// The most bytes registry uploads may hold at once, in the store (every server over it
    /// counts the same): uploads in progress and uploaded blobs no manifest has taken in yet
    /// (docs/HTTP.md).
    #[arg(long, default_value = "64GiB", value_name = "SIZE", value_parser = units::size)]
    pub upload_bytes: u64,
    /// The most bytes one token's registry uploads may hold at once.
    #[arg(long, default_value = "16GiB", value_name = "SIZE", value_parser = units::size)]
    pub upload_bytes_per_token: u64,
}

/// A container name as podman and runc accept it: a letter or digit, then letters, digits,
/// `_`, `.` and `-` (no `/`, so no path such as `../x`).
fn container_name(s: &str) -> Result<String, String> {
    let mut chars = s.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    if first_ok && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')) {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?} is not a container name: a letter or digit, then letters, digits, _ . -"))
    }
}
