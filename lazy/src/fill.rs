//! The daemon proper: receives the restored tasks, answers their faults at once and fills every
//! lazy page from many threads, then closes the userfaultfds.
//!
//! - Lazy memory is cut into segments of up to [`SEGMENT`] bytes of one pages file. A worker
//!   takes a segment (a faulted one first, then one read ahead behind a fault, see
//!   [`crate::ahead`], else the next in fill order), decodes its chunks from the store into a
//!   resident buffer and copies it into the task with `UFFDIO_COPY`s as large as the memory
//!   areas allow. What was needed first (faults, then what was read ahead behind them) is
//!   recorded as the profile for the next restore.
//! - One event thread reads every task's events under that task's gate (a write lock that
//!   copies hold for reading), so a copy never lands on memory the task has meanwhile
//!   unmapped, moved or dropped: mremap, munmap and madvise are recorded as operations that
//!   translate image addresses into current ones. A fork makes a new task whose missing
//!   memory is what its parent still missed at that moment (copies into the parent fail with
//!   EAGAIN while a fork is pending, so nothing is lost in between).
//! - Faults on holes (memory never dumped, hence zero) get zero pages.
//! - When nothing is missing any more, the userfaultfds are closed: what is left (holes) the
//!   kernel fills natively. On any failure the restored processes are killed.

use crate::ahead::Readahead;
use crate::error::{LazyError, Result};
use crate::fetch::FileChunks;
use crate::guard::Guard;
use crate::layout::{Layout, Process};
use crate::profile::{self, Profile};
use crate::socket::{self, Announced};
use crate::uffd::{Copied, Event, Uffd};
use gstore_gpu_dump::images::PAGE_SIZE;
use gstore_store::codec::Decoder;
use gstore_store::IndexedStore;
use serde::Serialize;
use std::collections::{HashMap, HashSet, VecDeque};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Bytes of one pages file a worker fills at a time.
pub const SEGMENT: u64 = 2 << 20;

const PENDING: u8 = 0;
const CLAIMED: u8 = 1;
const DONE: u8 = 2;

/// How to fill.
#[derive(Debug, Clone)]
pub struct FillOptions {
    /// Worker threads.
    pub workers: usize,
    /// A recorded order, if the image has one (one of another segment size is not used).
    pub profile: Option<Profile>,
}

/// What the daemon did.
#[derive(Debug, Clone, Serialize)]
pub struct FillReport {
    /// Tasks CRIU announced (processes of the image).
    pub tasks: usize,
    /// Tasks forked while the memory was filled.
    pub forked: usize,
    /// Lazy bytes of the image.
    pub lazy_bytes: u64,
    /// Faults answered (zero-page faults on holes included).
    pub faults: u64,
    /// Seconds from CRIU's connection until it reported the restore finished.
    pub criu_s: f64,
    /// Seconds from then until every lazy page was in place.
    pub fill_s: f64,
    /// Where the workers spent the fill: seconds per worker, averaged over the workers.
    pub waits: FillWaits,
    /// Whether the fill followed a recorded profile.
    pub used_profile: bool,
    /// The order memory was first needed in this restore (store it for the next one).
    #[serde(skip)]
    pub profile: Profile,
}

/// Where a fill's workers spent their time: seconds per worker, averaged over the workers.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct FillWaits {
    /// Reading segments' chunks from the store, checking and decoding them.
    pub reading_s: f64,
    /// Copying segments into the tasks (`UFFDIO_COPY`, and waiting for a task's memory
    /// events to be read when a copy met them).
    pub copying_s: f64,
    /// Waiting for a segment to fill (before the restore has finished, only faulted ones).
    pub waiting_s: f64,
    /// Copies that met a task's pending memory events and were tried again.
    pub retried: u64,
}

/// [`FillWaits`] as the workers add to it, in nanoseconds summed over the workers.
#[derive(Default)]
struct Spent {
    reading: AtomicU64,
    copying: AtomicU64,
    waiting: AtomicU64,
    retried: AtomicU64,
}

impl Spent {
    fn add(counter: &AtomicU64, since: Instant) {
        counter.fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// Per worker, of `workers`.
    fn mean(&self, workers: usize) -> FillWaits {
        let s = |c: &AtomicU64| c.load(Ordering::Relaxed) as f64 / 1e9 / workers.max(1) as f64;
        FillWaits {
            reading_s: s(&self.reading),
            copying_s: s(&self.copying),
            waiting_s: s(&self.waiting),
            retried: self.retried.load(Ordering::Relaxed),
        }
    }
}

/// One segment: a run of a pages file and where its pages go.
struct Segment {
    file: std::ops::Range<u64>,
    /// (image address, offset in the pages file, length)
    pieces: Vec<(u64, u64, u64)>,
    area_len: u64,
}

/// A process image's lazy memory, cut into segments.
struct Image {
    pid: u32,
    chunks: FileChunks,
    segments: Vec<Segment>,
    order: Vec<usize>,
}

impl Image {
    fn new(p: &Process, chunks: FileChunks, profile: Option<&Profile>) -> Image {
        let mut segments: Vec<Segment> = Vec::new();
        for r in &p.lazy {
            let mut at = 0;
            while at < r.len {
                let (vaddr, file_off) = (r.vaddr + at, r.file_off + at);
                let joins = segments.last().is_some_and(|s| {
                    s.file.end == file_off && s.area_len == r.area_len && s.file.end - s.file.start < SEGMENT
                });
                if !joins {
                    segments.push(Segment { file: file_off..file_off, pieces: Vec::new(), area_len: r.area_len });
                }
                let s = segments.last_mut().expect("just pushed");
                let len = (r.len - at).min(SEGMENT - (s.file.end - s.file.start));
                s.pieces.push((vaddr, file_off, len));
                s.file.end += len;
                at += len;
            }
        }
        let starts: Vec<u64> = segments.iter().map(|s| s.file.start).collect();
        let areas: Vec<u64> = segments.iter().map(|s| s.area_len).collect();
        let order = profile::fill_order(p.pid, &starts, &areas, profile);
        Image { pid: p.pid, chunks, segments, order }
    }

    /// The segment holding image address `vaddr`, if it is lazy.
    fn segment_at(&self, vaddr: u64) -> Option<usize> {
        let i = self.segments.partition_point(|s| s.pieces[0].0 <= vaddr).checked_sub(1)?;
        self.segments[i].pieces.iter().any(|&(v, _, len)| v <= vaddr && vaddr < v + len).then_some(i)
    }
}

/// What a task did to its memory since the restore, in order.
#[derive(Debug, Clone, Copy)]
enum Op {
    Remap { from: u64, to: u64, len: u64 },
    Drop { start: u64, end: u64 },
}

/// Where image address `addr` is now, for how many bytes that holds, or `None` (for as many
/// bytes) where the memory was dropped or unmapped.
fn translate(mut addr: u64, mut len: u64, ops: &[Op]) -> (Option<u64>, u64) {
    for op in ops {
        match *op {
            Op::Remap { from, to, len: n } => {
                if (from..from + n).contains(&addr) {
                    len = len.min(from + n - addr);
                    addr = to + (addr - from);
                } else if (to..to + n).contains(&addr) {
                    return (None, len.min(to + n - addr));
                } else {
                    if addr < from {
                        len = len.min(from - addr);
                    }
                    if addr < to {
                        len = len.min(to - addr);
                    }
                }
            }
            Op::Drop { start, end } => {
                if (start..end).contains(&addr) {
                    return (None, len.min(end - addr));
                }
                if addr < start {
                    len = len.min(start - addr);
                }
            }
        }
    }
    (Some(addr), len)
}

/// The image address of current address `addr`, or `None` if nothing of the image is there.
fn untranslate(mut addr: u64, ops: &[Op]) -> Option<u64> {
    for op in ops.iter().rev() {
        match *op {
            Op::Remap { from, to, len } => {
                if (to..to + len).contains(&addr) {
                    addr = from + (addr - to);
                } else if (from..from + len).contains(&addr) {
                    return None;
                }
            }
            Op::Drop { start, end } if (start..end).contains(&addr) => return None,
            Op::Drop { .. } => {}
        }
    }
    Some(addr)
}

/// One restored task being filled.
struct Task {
    /// Its pid (0 while a forked child's pid is not known yet).
    pid: AtomicI32,
    /// The task it was forked from (its own pid for announced tasks).
    parent: i32,
    image: usize,
    uffd: Uffd,
    state: Vec<AtomicU8>,
    gate: RwLock<Vec<Op>>,
    cursor: AtomicUsize,
    gone: AtomicBool,
}

impl Task {
    fn claim(&self, seg: usize) -> bool {
        self.state[seg].compare_exchange(PENDING, CLAIMED, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }
}

/// Segments (pid, offset in its pages file) in the order they were first needed (faulted or
/// read ahead).
#[derive(Default)]
struct FirstNeed {
    order: Vec<(u32, u64)>,
    seen: HashSet<(u32, u64)>,
}

/// State shared by the event thread and the workers.
struct Shared<'a> {
    store: &'a IndexedStore,
    guard: &'a Guard,
    images: Vec<Image>,
    tasks: RwLock<Vec<Arc<Task>>>,
    urgent: Mutex<VecDeque<(usize, usize)>>,
    ahead: Mutex<Readahead>,
    needed: Mutex<FirstNeed>,
    wake: Condvar,
    /// Segments not yet done, over all live tasks.
    remaining: AtomicUsize,
    /// Segments claimed and not yet finished.
    in_flight: AtomicUsize,
    started: AtomicBool,
    stop: AtomicBool,
    failure: Mutex<Option<LazyError>>,
    faults: AtomicU64,
    spent: Spent,
}

impl Shared<'_> {
    fn fail(&self, pid: i32, e: LazyError) {
        let mut f = self.failure.lock().expect("failure lock");
        if f.is_none() {
            *f = Some(LazyError::Fill { pid, cause: Box::new(e) });
        }
        self.stop.store(true, Ordering::Release);
        self.wake.notify_all();
    }

    fn push_urgent(&self, task: usize, seg: usize) {
        self.urgent.lock().expect("queue lock").push_back((task, seg));
        self.wake.notify_one();
    }

    /// Records that segment `seg` of `task` was needed, if it is the first time.
    fn needed(&self, task: &Task, seg: usize) {
        let image = &self.images[task.image];
        let key = (image.pid, image.segments[seg].file.start);
        let mut n = self.needed.lock().expect("profile lock");
        if n.seen.insert(key) {
            n.order.push(key);
        }
    }

    /// The next (task, segment) to fill, claimed; `None` when the workers should stop.
    fn next(&self) -> Option<(Arc<Task>, usize)> {
        loop {
            if self.stop.load(Ordering::Acquire) {
                return None;
            }
            let urgent = self.urgent.lock().expect("queue lock").pop_front();
            if let Some((t, s)) = urgent {
                let task = self.tasks.read().expect("tasks lock")[t].clone();
                if task.claim(s) {
                    return Some((task, s));
                }
                continue;
            }
            if self.started.load(Ordering::Acquire) {
                let tasks = self.tasks.read().expect("tasks lock").clone();
                let ahead = self.ahead.lock().expect("read-ahead lock").next(|t, s| tasks[t].claim(s));
                if let Some((t, s)) = ahead {
                    self.needed(&tasks[t], s);
                    return Some((tasks[t].clone(), s));
                }
                for task in tasks {
                    if task.gone.load(Ordering::Acquire) {
                        continue;
                    }
                    let order = &self.images[task.image].order;
                    loop {
                        let i = task.cursor.fetch_add(1, Ordering::AcqRel);
                        let Some(&s) = order.get(i) else { break };
                        if task.claim(s) {
                            return Some((task.clone(), s));
                        }
                    }
                }
            }
            let q = self.urgent.lock().expect("queue lock");
            if q.is_empty() && !self.stop.load(Ordering::Acquire) {
                let _ = self.wake.wait_timeout(q, Duration::from_millis(5)).expect("queue lock");
            }
        }
    }

    /// Marks `seg` of `task` done (or not needed any more).
    fn finish(&self, task: &Task, seg: usize) {
        task.state[seg].store(DONE, Ordering::Release);
        self.remaining.fetch_sub(1, Ordering::AcqRel);
    }

    /// The task exited: its missing memory no longer matters.
    fn retire(&self, task: &Task) {
        if task.gone.swap(true, Ordering::AcqRel) {
            return;
        }
        for st in &task.state {
            if st.compare_exchange(PENDING, DONE, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                self.remaining.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

/// A worker: fills claimed segments until told to stop.
fn worker(sh: &Shared<'_>) {
    let chunk_max = sh.store.config().chunk_max;
    let len = FileChunks::buffer_len(SEGMENT, chunk_max);
    let mut buf = match memmap2::MmapOptions::new().len(len).populate().map_anon() {
        Ok(b) => b,
        Err(e) => return sh.fail(0, LazyError::os("allocating a fill buffer", e)),
    };
    let (mut decoder, mut scratch) = (sh.store.decoder(), Vec::new());
    let mut idle = Instant::now();
    while let Some((task, seg)) = sh.next() {
        Spent::add(&sh.spent.waiting, idle);
        sh.in_flight.fetch_add(1, Ordering::AcqRel);
        let r = fill_segment(sh, &task, seg, &mut buf, &mut scratch, &mut decoder);
        match r {
            Ok(()) => sh.finish(&task, seg),
            Err(e) => {
                task.state[seg].store(PENDING, Ordering::Release);
                sh.fail(task.pid.load(Ordering::Acquire), e);
            }
        }
        sh.in_flight.fetch_sub(1, Ordering::AcqRel);
        idle = Instant::now();
    }
}

/// Decodes segment `seg` and copies it into `task`.
fn fill_segment(
    sh: &Shared<'_>,
    task: &Task,
    seg: usize,
    buf: &mut [u8],
    scratch: &mut Vec<u8>,
    decoder: &mut Decoder<'_>,
) -> Result<()> {
    let image = &sh.images[task.image];
    let s = &image.segments[seg];
    // From a store whose ranges arrive as bytes of their own (a remote one), raw chunks one
    // after another in a pack are copied in straight from the range read; anything else (and
    // everything of a local store, read with `pread`, not mapped) is decoded into `buf` first.
    let reading = Instant::now();
    let view = match sh.store.reads_into_buffers() {
        false => image.chunks.raw_view(sh.store, &s.file).transpose()?,
        true => None,
    };
    let (src, at): (&[u8], usize) = match &view {
        Some(v) => (v, 0),
        None => {
            let at = image.chunks.read_into(sh.store, s.file.clone(), buf, scratch, decoder)?;
            (buf, at)
        }
    };
    Spent::add(&sh.spent.reading, reading);
    let copying = Instant::now();
    let mut ops = task.gate.read().expect("gate");
    for &(vaddr, file_off, len) in &s.pieces {
        let from = at + (file_off - s.file.start) as usize;
        let mut pos = 0;
        while pos < len {
            let (dst, run) = translate(vaddr + pos, len - pos, &ops);
            let Some(dst) = dst else {
                pos += run;
                continue;
            };
            let copied = task
                .uffd
                .copy(dst, src[from + pos as usize..].as_ptr(), run)
                .map_err(|e| LazyError::os(format!("copying {run} bytes to {dst:#x}"), e))?;
            match copied {
                Copied::Done => pos += run,
                Copied::Exists(done) | Copied::NoRange(done) => pos += done + PAGE_SIZE,
                Copied::Again(done) => {
                    // Events are pending: let the event thread read them, then go on with the
                    // translation they bring.
                    pos += done;
                    sh.spent.retried.fetch_add(1, Ordering::Relaxed);
                    drop(ops);
                    std::thread::sleep(Duration::from_micros(50));
                    ops = task.gate.read().expect("gate");
                }
                Copied::Gone => {
                    drop(ops);
                    sh.retire(task);
                    Spent::add(&sh.spent.copying, copying);
                    return Ok(());
                }
            }
        }
    }
    Spent::add(&sh.spent.copying, copying);
    Ok(())
}

/// Receives every restored task's record from CRIU's connection `conn`, each task's host pid
/// told to the guard before its userfaultfd is taken, and every userfaultfd handed to the
/// guard too. The guard holds the connection first: userfaultfds CRIU has sent but this daemon
/// has not received yet stay open in its queue if the daemon dies now, so a task CRIU releases
/// waits on a missing page instead of reading zeros until the guard kills it. On failure the
/// tasks seen so far are killed.
fn receive_tasks(conn: &UnixStream, layout: &Layout, guard: &Guard) -> Result<Vec<Announced>> {
    guard.hold_connection(conn.as_raw_fd())?;
    let mut senders = Vec::new();
    let announced = socket::receive_tasks(conn, layout.tasks, &mut |host_pid| {
        senders.push(host_pid);
        guard.add(host_pid, None)
    })
    .and_then(|announced| {
        for uffd in announced.iter().filter_map(|a| a.uffd.as_ref()) {
            guard.hold(uffd.raw())?;
        }
        Ok(announced)
    });
    if announced.is_err() {
        kill_tree(&senders);
        guard.kill();
    }
    announced
}

/// The tasks to fill: each announced task with a userfaultfd whose image pid the layout
/// has, with every segment of its image pending; and how many segments that makes.
fn tasks_of(announced: Vec<Announced>, images: &[Image]) -> (Vec<Arc<Task>>, usize) {
    let mut tasks = Vec::new();
    let mut remaining = 0;
    for Announced { pid, host_pid, uffd } in announced {
        let (Some(uffd), Some(image)) = (uffd, images.iter().position(|i| i.pid as i32 == pid)) else { continue };
        let n = images[image].segments.len();
        remaining += n;
        tasks.push(Arc::new(Task {
            pid: AtomicI32::new(host_pid),
            parent: host_pid,
            image,
            uffd,
            state: (0..n).map(|_| AtomicU8::new(PENDING)).collect(),
            gate: RwLock::new(Vec::new()),
            cursor: AtomicUsize::new(0),
            gone: AtomicBool::new(false),
        }));
    }
    (tasks, remaining)
}

/// Whether the page at `addr` of `pid` is in memory (present or swapped), from
/// `/proc/PID/pagemap`. `None` if that cannot be read.
fn page_present(pid: i32, addr: u64) -> Option<bool> {
    let f = std::fs::File::open(format!("/proc/{pid}/pagemap")).ok()?;
    let mut word = [0u8; 8];
    f.read_exact_at(&mut word, addr / PAGE_SIZE * 8).ok()?;
    Some(u64::from_ne_bytes(word) & (3 << 62) != 0)
}

/// Kills the restored processes and everything they started.
fn kill_tree(roots: &[i32]) {
    let roots: Vec<u32> = roots.iter().map(|&pid| pid as u32).collect();
    for pid in gstore_gpu_dump::procfs::descendants(&roots) {
        // SAFETY: plain kill(2).
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
}

/// Serves the restore whose CRIU connects to `conn`: receives the tasks, hands `guard` (started
/// before CRIU, with the image's pids) a copy of each userfaultfd, fills their memory and
/// returns once every lazy page is in place and the userfaultfds are closed; the guard is
/// released then. `abort` calls it off (CRIU failed). Once the tasks are received, a failure
/// kills the restored processes (and the guard) before this returns.
pub fn serve(
    store: &IndexedStore,
    layout: &Layout,
    chunks: Vec<FileChunks>,
    conn: UnixStream,
    guard: &Guard,
    opts: &FillOptions,
    abort: &AtomicBool,
) -> Result<FillReport> {
    let connected = Instant::now();
    let announced = receive_tasks(&conn, layout, guard)?;
    let profile = opts.profile.as_ref().filter(|p| p.segment_bytes == SEGMENT);
    let images: Vec<Image> = layout.processes.iter().zip(chunks).map(|(p, c)| Image::new(p, c, profile)).collect();
    let (tasks, remaining) = tasks_of(announced, &images);
    let sh = Shared {
        store,
        guard,
        images,
        tasks: RwLock::new(tasks),
        urgent: Mutex::new(VecDeque::new()),
        ahead: Mutex::new(Readahead::default()),
        needed: Mutex::new(FirstNeed::default()),
        wake: Condvar::new(),
        remaining: AtomicUsize::new(remaining),
        in_flight: AtomicUsize::new(0),
        started: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        failure: Mutex::new(None),
        faults: AtomicU64::new(0),
        spent: Spent::default(),
    };
    let mut events = EventLoop { conn: Some(conn), criu_s: 0.0, forked: 0 };
    let outcome = std::thread::scope(|scope| {
        for _ in 0..opts.workers.max(1) {
            scope.spawn(|| worker(&sh));
        }
        let r = events.run(&sh, abort, connected);
        sh.stop.store(true, Ordering::Release);
        sh.wake.notify_all();
        r
    });
    let known: Vec<i32> =
        sh.tasks.read().expect("tasks lock").iter().map(|t| t.pid.load(Ordering::Acquire)).filter(|&p| p > 0).collect();
    let failure = sh.failure.lock().expect("failure lock").take();
    match (outcome, failure) {
        (Ok(fill_s), None) => {
            drop(sh.tasks.write().expect("tasks lock").drain(..));
            guard.release();
            Ok(FillReport {
                tasks: layout.tasks,
                forked: events.forked,
                lazy_bytes: layout.lazy_bytes(),
                faults: sh.faults.load(Ordering::Acquire),
                criu_s: events.criu_s,
                fill_s,
                waits: sh.spent.mean(opts.workers.max(1)),
                used_profile: profile.is_some(),
                profile: Profile::new(SEGMENT, std::mem::take(&mut sh.needed.lock().expect("profile lock").order)),
            })
        }
        (r, failure) => {
            kill_tree(&known);
            guard.kill();
            Err(failure.or(r.err()).unwrap_or(LazyError::Aborted))
        }
    }
}

/// The event thread's state.
struct EventLoop {
    conn: Option<UnixStream>,
    criu_s: f64,
    forked: usize,
}

impl EventLoop {
    /// Runs until the memory is complete (returns the fill seconds) or the fill fails.
    fn run(&mut self, sh: &Shared<'_>, abort: &AtomicBool, connected: Instant) -> Result<f64> {
        let mut started_at = None;
        loop {
            if abort.load(Ordering::Acquire) {
                return Err(LazyError::Aborted);
            }
            if sh.stop.load(Ordering::Acquire) {
                return Err(LazyError::Aborted);
            }
            let tasks = sh.tasks.read().expect("tasks lock").clone();
            let mut polls: Vec<libc::pollfd> = tasks
                .iter()
                .filter(|t| !t.gone.load(Ordering::Acquire))
                .map(|t| libc::pollfd { fd: t.uffd.raw(), events: libc::POLLIN, revents: 0 })
                .collect();
            if let Some(c) = &self.conn {
                polls.push(libc::pollfd { fd: c.as_raw_fd(), events: libc::POLLIN, revents: 0 });
            }
            // SAFETY: polling descriptors owned by live tasks and the connection.
            let n = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, 2) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(LazyError::os("polling the restored tasks", e));
                }
            }
            if let Some(c) = self.conn.as_ref().filter(|_| polls.last().is_some_and(|p| p.revents != 0)) {
                if !socket::wait_restore_finished(c)? {
                    return Err(LazyError::Protocol("CRIU ended the connection before the restore finished".into()));
                }
                self.conn = None;
                self.criu_s = connected.elapsed().as_secs_f64();
                started_at = Some(Instant::now());
                sh.started.store(true, Ordering::Release);
                sh.wake.notify_all();
            }
            for (i, task) in tasks.iter().enumerate() {
                if !task.gone.load(Ordering::Acquire) && polls.iter().any(|p| p.fd == task.uffd.raw() && p.revents != 0)
                {
                    self.drain(sh, i, task)?;
                }
            }
            self.resolve_children(sh);
            if let Some(t) = started_at {
                if sh.remaining.load(Ordering::Acquire) == 0 && sh.in_flight.load(Ordering::Acquire) == 0 {
                    // Last look for events (a fork adds a task with missing memory).
                    let before = sh.tasks.read().expect("tasks lock").len();
                    for (i, task) in tasks.iter().enumerate() {
                        if !task.gone.load(Ordering::Acquire) {
                            self.drain(sh, i, task)?;
                        }
                    }
                    if sh.remaining.load(Ordering::Acquire) == 0 && sh.tasks.read().expect("tasks lock").len() == before
                    {
                        return Ok(t.elapsed().as_secs_f64());
                    }
                }
            }
        }
    }

    /// Reads and applies `task`'s pending events under its gate.
    fn drain(&mut self, sh: &Shared<'_>, index: usize, task: &Arc<Task>) -> Result<()> {
        let mut ops = task.gate.write().expect("gate");
        let mut events = Vec::new();
        if let Err(e) = task.uffd.read_events(&mut events) {
            return Err(LazyError::os(format!("reading events of pid {}", task.pid.load(Ordering::Acquire)), e));
        }
        let image = &sh.images[task.image];
        for ev in events {
            match ev {
                Event::PageFault { addr } => {
                    sh.faults.fetch_add(1, Ordering::AcqRel);
                    let page = addr - addr % PAGE_SIZE;
                    let seg = untranslate(page, &ops).and_then(|orig| image.segment_at(orig));
                    let Some(seg) = seg else {
                        // A hole (never dumped: zero) or memory the task dropped.
                        match task.uffd.zero(page, PAGE_SIZE) {
                            Ok(Copied::Gone) => sh.retire(task),
                            Ok(_) => {}
                            Err(e) => return Err(LazyError::os(format!("mapping a zero page at {page:#x}"), e)),
                        }
                        continue;
                    };
                    sh.needed(task, seg);
                    match task.state[seg].load(Ordering::Acquire) {
                        PENDING => {
                            sh.push_urgent(index, seg);
                            sh.ahead.lock().expect("read-ahead lock").fault(index, seg, image.segments.len());
                        }
                        DONE => {
                            // Usually a fault read after the copy that already woke it; if the
                            // page is really missing, fill the segment again.
                            let pid = task.pid.load(Ordering::Acquire);
                            if pid <= 0 || page_present(pid, page) != Some(true) {
                                if task.state[seg]
                                    .compare_exchange(DONE, PENDING, Ordering::AcqRel, Ordering::Acquire)
                                    .is_ok()
                                {
                                    sh.remaining.fetch_add(1, Ordering::AcqRel);
                                    sh.push_urgent(index, seg);
                                }
                            } else {
                                task.uffd.wake(page, PAGE_SIZE);
                            }
                        }
                        _ => {}
                    }
                }
                Event::Fork { uffd } => {
                    let state: Vec<AtomicU8> = task
                        .state
                        .iter()
                        .map(|s| AtomicU8::new(if s.load(Ordering::Acquire) == DONE { DONE } else { PENDING }))
                        .collect();
                    let missing = state.iter().filter(|s| s.load(Ordering::Relaxed) == PENDING).count();
                    sh.remaining.fetch_add(missing, Ordering::AcqRel);
                    // The guard holds the child's descriptor too; its pid follows once known.
                    let fd = uffd.raw();
                    let child = Arc::new(Task {
                        pid: AtomicI32::new(0),
                        parent: task.pid.load(Ordering::Acquire),
                        image: task.image,
                        uffd,
                        state,
                        gate: RwLock::new(ops.clone()),
                        cursor: AtomicUsize::new(0),
                        gone: AtomicBool::new(false),
                    });
                    sh.tasks.write().expect("tasks lock").push(child);
                    self.forked += 1;
                    sh.guard.hold(fd)?;
                    sh.wake.notify_all();
                }
                Event::Remap { from, to, len } => ops.push(Op::Remap { from, to, len }),
                Event::Remove { start, end } | Event::Unmap { start, end } => ops.push(Op::Drop { start, end }),
            }
        }
        Ok(())
    }

    /// Finds the pids of forked tasks: a new child of their parent that no task has yet.
    fn resolve_children(&mut self, sh: &Shared<'_>) {
        let tasks = sh.tasks.read().expect("tasks lock").clone();
        let unknown: Vec<&Arc<Task>> = tasks.iter().filter(|t| t.pid.load(Ordering::Acquire) == 0).collect();
        if unknown.is_empty() {
            return;
        }
        let known: HashSet<i32> = tasks.iter().map(|t| t.pid.load(Ordering::Acquire)).collect();
        let mut by_parent: HashMap<i32, Vec<&Arc<Task>>> = HashMap::new();
        for t in unknown {
            by_parent.entry(t.parent).or_default().push(t);
        }
        for (parent, waiting) in by_parent {
            let fresh: Vec<i32> = children_of(parent).into_iter().filter(|c| !known.contains(c)).collect();
            if let ([t], [pid]) = (&waiting[..], &fresh[..]) {
                t.pid.store(*pid, Ordering::Release);
                let _ = sh.guard.add(*pid, None);
            }
        }
    }
}

/// The children of every thread of `pid`.
fn children_of(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    if let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in dir.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("children")) {
                out.extend(s.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn translation_follows_moves_and_drops() {
        let ops = [Op::Remap { from: 0x10000, to: 0x50000, len: 0x4000 }, Op::Drop { start: 0x51000, end: 0x52000 }];
        assert_eq!(translate(0x8000, 0x10000, &ops), (Some(0x8000), 0x8000), "stops where the move begins");
        assert_eq!(translate(0x10000, 0x10000, &ops), (Some(0x50000), 0x1000), "moved, up to the drop");
        assert_eq!(translate(0x11000, 0x3000, &ops), (None, 0x1000), "dropped after the move");
        assert_eq!(translate(0x12000, 0x3000, &ops), (Some(0x52000), 0x2000));
        assert_eq!(translate(0x50000, 0x1000, &ops), (None, 0x1000), "replaced by the move");
        assert_eq!(untranslate(0x52000, &ops), Some(0x12000));
        assert_eq!(untranslate(0x51000, &ops), None);
        assert_eq!(untranslate(0x10000, &ops), None, "vacated by the move");
        assert_eq!(untranslate(0x9000, &ops), Some(0x9000));
    }
}
