//! gstore's Python package, native part (`gstore._gstore`): a store opened from Python,
//! pushes of buffers held in memory, loads into host memory or VRAM that NumPy and PyTorch
//! take over without a copy (`__array_interface__`, `__cuda_array_interface__`), and the
//! everyday commands. Long calls release the GIL. The Python layer (python/gstore/) turns
//! state dicts into safetensors files and back.

use gstore_gpu_dump::cuda::DeviceBuffer;
use gstore_gpu_dump::CudaDriver;
use gstore_progress::Bars;
use gstore_store::format::manifest::Manifest;
use gstore_store::format::meta::ImageMeta;
use gstore_store::{
    commands::gc, commands::images, commands::push, commands::usage, ErrorKind, IndexedStore, Store as RustStore,
    StoreConfig, StoreError, StoreLocation, TagRef,
};
use pyo3::buffer::PyBuffer;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyDict;

create_exception!(_gstore, GstoreError, PyException, "Any failure of a gstore operation; the message is the CLI's.");
create_exception!(_gstore, NotFoundError, GstoreError, "The named image, tag, object or store does not exist.");
create_exception!(
    _gstore,
    CorruptError,
    GstoreError,
    "Stored data failed its checks: run `gstore verify --read-data`."
);
create_exception!(
    _gstore,
    ConflictError,
    GstoreError,
    "Another writer changed the object first, or it exists already."
);
create_exception!(
    _gstore,
    InvalidError,
    GstoreError,
    "The caller's input was refused (a tag name, a path, a size, a missing or wrong key)."
);

/// The Python exception for a store error, with the CLI's message.
fn py_err(e: impl Into<StoreError>) -> PyErr {
    let e: StoreError = e.into();
    let msg = e.to_string();
    match e.kind() {
        ErrorKind::NotFound => NotFoundError::new_err(msg),
        ErrorKind::Damage => CorruptError::new_err(msg),
        ErrorKind::Conflict => ConflictError::new_err(msg),
        ErrorKind::Usage => InvalidError::new_err(msg),
        ErrorKind::Unavailable | ErrorKind::Failure => GstoreError::new_err(msg),
    }
}

fn to_json<T: serde::Serialize>(value: &T) -> PyResult<String> {
    serde_json::to_string(value).map_err(|e| GstoreError::new_err(e.to_string()))
}

/// A gstore store: a directory, `s3://BUCKET[/PREFIX]` or `http://HOST:PORT`, as for the
/// CLI's `--store` (the same environment variables apply); the default local store when
/// `None`. Every call opens what it needs and lets go of it afterwards, so CLI commands on
/// the same store are not kept waiting between calls.
#[pyclass(frozen, module = "gstore._gstore")]
struct Store {
    location: StoreLocation,
    /// This process's index slot, if it has one (`Store::with_index_slot`).
    index_slot: Option<u32>,
}

impl Store {
    fn open(&self) -> Result<RustStore, StoreError> {
        RustStore::open(&self.location)
    }

    /// The store without its index, using this handle's index slot when it has one.
    fn open_plain(&self) -> Result<RustStore, StoreError> {
        let store = self.open()?;
        Ok(match self.index_slot {
            Some(n) => store.with_index_slot(n),
            None => store,
        })
    }

    fn open_indexed(&self) -> Result<IndexedStore, StoreError> {
        self.open_plain()?.with_index(&|msg: &str| eprintln!("gstore: {msg}"))
    }

    /// Loads `image` into the memory of the GPU whose context `open_context` gives. The
    /// device side of the load (context, staging, kernel) is made ready from the start, while
    /// the image's manifest is read, what it needs worked out and the index opened. Returns the
    /// load and the seconds until the store and the image were open.
    fn load_to_device(
        &self,
        image: &str,
        open_context: impl FnOnce() -> Result<gstore_gpu_dump::cuda::Context, StoreError> + Send,
        budget: gstore_restore::Budget,
        progress: &dyn gstore_store::progress::Progress,
    ) -> Result<(gstore_restore::DeviceImage, f64), StoreError> {
        let t = std::time::Instant::now();
        let on_wait = |msg: &str| eprintln!("gstore: {msg}");
        std::thread::scope(|s| {
            let device = s.spawn(|| {
                let plain = self.open()?;
                let (ctx, staging) = std::thread::scope(|s| {
                    let staging = s.spawn(|| gstore_restore::Staging::map(&plain, budget));
                    (open_context(), staging.join().expect("mapping staging memory does not panic"))
                });
                gstore_restore::PreparedDevice::prepare(&plain, ctx?, || staging)
            });
            let device = || device.join().expect("preparing the device does not panic");
            let (store, _, m, needs) =
                RustStore::open_image_then(|| self.open_plain(), image, &on_wait, gstore_restore::plan::Needs::of)?;
            let open_s = t.elapsed().as_secs_f64();
            let image = gstore_restore::restore_prepared(&store, &m, Some(needs), device, budget, progress)?;
            Ok((image, open_s))
        })
    }

    /// Opens the store with its index to read an image (read-only while the index is up to
    /// date: `Store::with_index_to_read`) and reads the manifest `image` names, the two at
    /// once.
    fn open_image(&self, image: &str) -> Result<(IndexedStore, Manifest), StoreError> {
        let on_wait = |msg: &str| eprintln!("gstore: {msg}");
        let (store, _, m, ()) = RustStore::open_image_then(|| self.open_plain(), image, &on_wait, |_| ())?;
        Ok((store, m))
    }
}

fn location_of(location: Option<&str>) -> PyResult<StoreLocation> {
    match location {
        Some(s) => StoreLocation::parse(s).map_err(py_err),
        None => StoreLocation::from_env().map_err(py_err),
    }
}

#[pymethods]
impl Store {
    /// Opens the store at `location` (see the class); fails if there is none. With
    /// `index_slot`, this process uses its own index of the store on this machine (one per
    /// rank of a job: ranks push side by side without waiting for each other's index lock).
    #[new]
    #[pyo3(signature = (location=None, index_slot=None))]
    fn new(location: Option<&str>, index_slot: Option<u32>) -> PyResult<Store> {
        let s = Store { location: location_of(location)?, index_slot };
        s.open().map_err(py_err)?;
        Ok(s)
    }

    /// Creates an empty store with the default configuration at `location` (`gstore init`).
    #[staticmethod]
    #[pyo3(signature = (location=None))]
    fn init(location: Option<&str>) -> PyResult<Store> {
        let location = location_of(location)?;
        RustStore::init(&location, &StoreConfig::default()).map_err(py_err)?;
        Ok(Store { location, index_slot: None })
    }

    /// Where the store is, in words.
    fn describe(&self) -> PyResult<String> {
        Ok(self.open().map_err(py_err)?.describe())
    }

    /// Pushes files made of buffers as a new image tagged `tag`: each file is `(path,
    /// [buffer, ...])`, its bytes the buffers' bytes one after another (C-contiguous bytes,
    /// read in place; the GIL is released meanwhile, so they must not change). `meta` is a
    /// JSON object recorded in the manifest. Returns the push report as JSON.
    #[pyo3(signature = (tag, files, meta="{}", progress=true))]
    fn push_buffers(
        &self,
        py: Python<'_>,
        tag: &str,
        files: Vec<(String, Vec<PyBuffer<u8>>)>,
        meta: &str,
        progress: bool,
    ) -> PyResult<String> {
        let tag = TagRef::parse_new(tag).map_err(py_err)?;
        let meta: ImageMeta = serde_json::from_str(meta)
            .map_err(|e| InvalidError::new_err(format!("meta must be a JSON object: {e}")))?;
        let mut pieces: Vec<(String, Vec<&[u8]>)> = Vec::with_capacity(files.len());
        for (path, buffers) in &files {
            let mut parts = Vec::with_capacity(buffers.len());
            for b in buffers {
                if !b.is_c_contiguous() {
                    return Err(InvalidError::new_err(format!("file {path:?}: a buffer is not contiguous")));
                }
                // SAFETY: the buffer is held (and its exporter kept from resizing it) until
                // `files` drops at the end of this call; the caller promises not to write to it
                // while the GIL is released.
                parts.push(unsafe { std::slice::from_raw_parts(b.buf_ptr() as *const u8, b.len_bytes()) });
            }
            pieces.push((path.clone(), parts));
        }
        let report = py.detach(|| {
            let store = self.open_indexed()?;
            push::push_pieces(&store, &pieces, &tag, meta, &Bars::new(progress))
        });
        to_json(&report.map_err(py_err)?)
    }

    /// Loads every file of `image` into host memory: `[(path, HostFile)]` in manifest order,
    /// each chunk checked against its hash; with `paths`, only those files.
    #[pyo3(signature = (image, memory_budget=1 << 30, progress=true, paths=None))]
    fn load_host(
        &self,
        py: Python<'_>,
        image: &str,
        memory_budget: u64,
        progress: bool,
        paths: Option<Vec<String>>,
    ) -> PyResult<Vec<(String, HostFile)>> {
        let loaded = py.detach(|| {
            let (store, m) = self.open_image(image)?;
            let m = match &paths {
                Some(p) => m.subset(|e| p.contains(&e.path)),
                None => m,
            };
            gstore_restore::restore_to_memory(
                &store,
                &m,
                gstore_restore::Budget::of(memory_budget),
                &Bars::new(progress),
            )
        });
        Ok(loaded.map_err(py_err)?.entries.into_iter().map(|e| (e.path, HostFile { data: e.data })).collect())
    }

    /// Loads byte ranges of `image`'s files into host memory, `ranges` as `(path, offset,
    /// len)`: for each, a `HostFile` holding the whole chunks that cover it and where the
    /// range starts in it. Only those chunks are read (a chunk two ranges share, once), each
    /// checked against its hash.
    #[pyo3(signature = (image, ranges, memory_budget=1 << 30, progress=false))]
    fn load_ranges(
        &self,
        py: Python<'_>,
        image: &str,
        ranges: Vec<(String, u64, u64)>,
        memory_budget: u64,
        progress: bool,
    ) -> PyResult<Vec<(HostFile, u64)>> {
        let loaded = py.detach(|| {
            let (store, m) = self.open_image(image)?;
            let (pieces, skips) = m.pieces(&ranges)?;
            let image = gstore_restore::restore_to_memory(
                &store,
                &pieces,
                gstore_restore::Budget::of(memory_budget),
                &Bars::new(progress),
            )?;
            Ok::<_, StoreError>(image.entries.into_iter().map(|e| HostFile { data: e.data }).zip(skips).collect())
        });
        loaded.map_err(py_err)
    }

    /// Loads every file of `image` into the memory of GPU `device` (CUDA): `[(path,
    /// CudaFile)]` in manifest order, and the phases' seconds (`plan_s`, `alloc_s`,
    /// `transfer_s`) as JSON. Every chunk is checked before the call returns. With `held`,
    /// the image comes from the `gstore hold` answering at that socket (the store is not read).
    #[pyo3(signature = (image, device=0, memory_budget=1 << 30, progress=true, held=None))]
    fn load_cuda(
        &self,
        py: Python<'_>,
        image: &str,
        device: u32,
        memory_budget: u64,
        progress: bool,
        held: Option<std::path::PathBuf>,
    ) -> PyResult<(Vec<(String, CudaFile)>, String)> {
        let loaded = py.detach(|| {
            if let Some(socket) = held {
                let ctx = CudaDriver::load().and_then(|d| d.context(device)).map_err(StoreError::device)?;
                return gstore_restore::load_held(&socket, image, &ctx).map(|image| (image, 0.0));
            }
            let started = std::thread::spawn(move || CudaDriver::load()?.context(device));
            let open = || started.join().expect("CUDA start does not panic").map_err(StoreError::device);
            self.load_to_device(image, open, gstore_restore::Budget::of(memory_budget), &Bars::new(progress))
        });
        let (image, open_s) = loaded.map_err(py_err)?;
        let phases = serde_json::json!({
            "plan_s": image.plan_s, "alloc_s": image.alloc_s, "transfer_s": image.transfer_s, "path": image.path,
            "waits": image.waits, "open_s": open_s,
        });
        let files = image.entries.into_iter().map(|e| (e.path, CudaFile { buffer: e.buffer })).collect();
        Ok((files, phases.to_string()))
    }

    /// Every tag with its image's manifest id, creation time and size, as JSON (`gstore ls`).
    fn list(&self, py: Python<'_>) -> PyResult<String> {
        let rows = py.detach(|| images::list(&self.open()?));
        to_json(&rows.map_err(py_err)?)
    }

    /// One image described, as JSON (`gstore show`).
    fn show(&self, py: Python<'_>, image: &str) -> PyResult<String> {
        let info = py.detach(|| images::show(&self.open()?, image));
        to_json(&info.map_err(py_err)?)
    }

    /// Space used, with the bytes each image alone costs, as JSON (`gstore du`).
    fn du(&self, py: Python<'_>) -> PyResult<String> {
        let u = py.detach(|| usage::usage(&self.open_indexed()?));
        to_json(&u.map_err(py_err)?)
    }

    /// Points the new tag `target` at the image `source` names (`gstore tag`); returns the
    /// tag record as JSON.
    fn tag(&self, py: Python<'_>, source: &str, target: &str) -> PyResult<String> {
        let rec = py.detach(|| images::tag(&self.open_indexed()?, source, target));
        to_json(&rec.map_err(py_err)?)
    }

    /// Tags `tag` with one image holding every entry of the images `parts` (manifest ids),
    /// their chunks referenced, not stored again; `meta` is a JSON object for its manifest.
    /// Returns the tag record as JSON.
    #[pyo3(signature = (tag, parts, meta="{}"))]
    fn compose(&self, py: Python<'_>, tag: &str, parts: Vec<String>, meta: &str) -> PyResult<String> {
        let tag = TagRef::parse_new(tag).map_err(py_err)?;
        let meta: ImageMeta = serde_json::from_str(meta)
            .map_err(|e| InvalidError::new_err(format!("meta must be a JSON object: {e}")))?;
        let rec = py.detach(|| {
            let ids = parts.iter().map(|p| gstore_store::ObjectId::from_hex(p)).collect::<Result<Vec<_>, _>>()?;
            gstore_store::commands::compose::compose(&self.open_indexed()?, &tag, &ids, meta)
        });
        to_json(&rec.map_err(py_err)?)
    }

    /// Pins or unpins a tag (`gstore pin` / `unpin`); returns the tag record as JSON.
    fn pin(&self, py: Python<'_>, tag: &str, pinned: bool) -> PyResult<String> {
        let rec = py.detach(|| self.open()?.set_pinned(&TagRef::parse(tag)?, pinned));
        to_json(&rec.map_err(py_err)?)
    }

    /// Retention and a gc pass (`gstore gc`); returns the report as JSON.
    #[pyo3(signature = (keep_last=None, keep_within_s=None, keep_daily=None, keep_weekly=None, prefix=None, dry_run=false))]
    #[allow(clippy::too_many_arguments)]
    fn gc(
        &self,
        py: Python<'_>,
        keep_last: Option<usize>,
        keep_within_s: Option<u64>,
        keep_daily: Option<usize>,
        keep_weekly: Option<usize>,
        prefix: Option<String>,
        dry_run: bool,
    ) -> PyResult<String> {
        let policy =
            gc::retention::Policy { keep_last, keep_within_secs: keep_within_s, keep_daily, keep_weekly, prefix };
        let opts = gc::GcOptions { policy, dry_run, ..Default::default() };
        let report = py.detach(|| gc::gc(&self.open()?, &opts, &gstore_store::progress::Silent));
        to_json(&report.map_err(py_err)?)
    }

    /// Stores retention rules for a tag name or name prefix (`gstore policy set`); returns
    /// every stored policy as JSON.
    #[pyo3(signature = (pattern, keep_last=None, keep_within_s=None, keep_daily=None, keep_weekly=None))]
    fn set_policy(
        &self,
        py: Python<'_>,
        pattern: &str,
        keep_last: Option<usize>,
        keep_within_s: Option<u64>,
        keep_daily: Option<usize>,
        keep_weekly: Option<usize>,
    ) -> PyResult<String> {
        let rules =
            gc::retention::Policy { keep_last, keep_within_secs: keep_within_s, keep_daily, keep_weekly, prefix: None };
        let all = py.detach(|| gc::policies::set(&self.open()?, pattern, rules));
        to_json(&all.map_err(py_err)?)
    }

    /// Every stored retention policy as JSON (`gstore policy show`).
    fn policies(&self, py: Python<'_>) -> PyResult<String> {
        to_json(&py.detach(|| gc::policies::read(&self.open()?)).map_err(py_err)?)
    }

    /// Removes the stored policy of `pattern` (`gstore policy rm`); returns what remains as JSON.
    fn remove_policy(&self, py: Python<'_>, pattern: &str) -> PyResult<String> {
        to_json(&py.detach(|| gc::policies::remove(&self.open()?, pattern)).map_err(py_err)?)
    }

    /// Removes a tag (`gstore rm`: a name that looks like an image id is refused); its chunks
    /// stay until garbage collection.
    fn rm(&self, py: Python<'_>, image: &str) -> PyResult<()> {
        py.detach(|| images::remove_tags(&self.open()?, &[image]).map(drop)).map_err(py_err)
    }
}

/// One file of an image in host memory (a page-aligned anonymous mapping), exposed as a
/// writable 1-D uint8 array through `__array_interface__`: `numpy.asarray(f)` shares it, and
/// keeps this object (and the memory) alive.
#[pyclass(frozen, module = "gstore._gstore")]
struct HostFile {
    data: memmap2::MmapMut,
}

#[pymethods]
impl HostFile {
    fn __len__(&self) -> usize {
        self.data.len()
    }

    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        array_interface(py, self.data.as_ptr() as u64, self.data.len(), None)
    }
}

/// One file of an image in GPU memory, exposed as a writable 1-D uint8 device array through
/// `__cuda_array_interface__` (version 3): `torch.as_tensor(f, device="cuda:N")` shares it
/// and keeps this object alive; the memory is freed when the last user lets go.
#[pyclass(frozen, module = "gstore._gstore")]
struct CudaFile {
    buffer: DeviceBuffer,
}

#[pymethods]
impl CudaFile {
    fn __len__(&self) -> usize {
        self.buffer.len()
    }

    /// The GPU the memory is on.
    #[getter]
    fn device(&self) -> u32 {
        self.buffer.context().device()
    }

    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        // The load synchronised before it returned: no stream to wait on.
        array_interface(py, self.buffer.ptr(), self.buffer.len(), Some(py.None()))
    }
}

/// The array interface of `len` bytes at `ptr` (NumPy's, or CUDA's when `stream` is given).
fn array_interface<'py>(
    py: Python<'py>,
    ptr: u64,
    len: usize,
    stream: Option<Py<PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("shape", (len,))?;
    d.set_item("typestr", "|u1")?;
    d.set_item("data", (ptr, false))?;
    d.set_item("version", 3)?;
    if let Some(s) = stream {
        d.set_item("stream", s)?;
    }
    Ok(d)
}

/// The native module.
#[pymodule]
fn _gstore(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Store>()?;
    m.add_class::<HostFile>()?;
    m.add_class::<CudaFile>()?;
    let py = m.py();
    m.add("GstoreError", py.get_type::<GstoreError>())?;
    m.add("NotFoundError", py.get_type::<NotFoundError>())?;
    m.add("CorruptError", py.get_type::<CorruptError>())?;
    m.add("ConflictError", py.get_type::<ConflictError>())?;
    m.add("InvalidError", py.get_type::<InvalidError>())?;
    Ok(())
}
