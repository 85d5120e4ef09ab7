//! Where the warehouse and staged chunks keep their files: a local directory (the embedded
//! default) or S3-compatible object storage (`--warehouse-url s3://bucket/prefix`, through the
//! `object_store` crate).
//!
//! Paths are relative, `/`-separated. Every write is whole and atomic: a reader sees the old
//! object or the new one, never part of one (a local file is written beside its name, fsynced
//! and renamed; an S3 PUT replaces atomically). The warehouse code is synchronous and runs on
//! blocking threads, so the object store runs its requests on a small runtime of its own.

use std::fmt;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::{Buf as _, Bytes};
use futures_util::TryStreamExt as _;
use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;
use parquet::file::reader::{ChunkReader, Length};

/// What writes an object's bytes for [`Storage::put_with`].
pub type Fill<'a> = dyn FnMut(&mut (dyn io::Write + Send)) -> io::Result<()> + 'a;

/// A place for whole files.
pub trait Storage: Send + Sync + fmt::Debug {
    /// A readable name of `path`, for messages.
    fn location(&self, path: &str) -> String;

    /// Writes `bytes` at `path` durably, replacing what was there.
    ///
    /// # Errors
    /// When it cannot be written.
    fn put(&self, path: &str, bytes: Vec<u8>) -> io::Result<()>;

    /// Writes the object at `path` from what `write` writes to the writer it is given, as
    /// [`Storage::put`] does (durably, replacing what was there, whole or not at all);
    /// answers its length. A local directory writes straight into the file beside its name,
    /// so a large object is never whole in memory; object storage gathers it and puts it.
    ///
    /// # Errors
    /// When `write` fails (nothing is written then), or the object cannot be written.
    fn put_with(&self, path: &str, write: &mut Fill<'_>) -> io::Result<u64> {
        let mut bytes = Vec::new();
        write(&mut bytes)?;
        let length = bytes.len() as u64;
        self.put(path, bytes)?;
        Ok(length)
    }

    /// The whole object at `path`; `None` when there is none.
    ///
    /// # Errors
    /// When it exists but cannot be read.
    fn get(&self, path: &str) -> io::Result<Option<Bytes>>;

    /// Bytes `range` of the object at `path`.
    ///
    /// # Errors
    /// When it cannot be read.
    fn get_range(&self, path: &str, range: Range<u64>) -> io::Result<Bytes>;

    /// Every object under `prefix` (a directory-like prefix, `""` for all), relative paths.
    ///
    /// # Errors
    /// When the listing fails.
    fn list(&self, prefix: &str) -> io::Result<Vec<String>>;

    /// Deletes the object at `path` (nothing when there is none).
    ///
    /// # Errors
    /// When it cannot be deleted.
    fn delete(&self, path: &str) -> io::Result<()>;

    /// The local file of `path`, when this storage is a local directory.
    fn local_path(&self, path: &str) -> Option<PathBuf>;

    /// Deletes every object under `prefix`.
    ///
    /// # Errors
    /// When one cannot be listed or deleted.
    fn delete_prefix(&self, prefix: &str) -> io::Result<()> {
        for path in self.list(prefix)? {
            self.delete(&path)?;
        }
        Ok(())
    }
}

/// A local directory.
#[derive(Debug, Clone)]
pub struct LocalStorage {
    root: PathBuf,
}

impl LocalStorage {
    /// The directory `root` (made when missing).
    ///
    /// # Errors
    /// When it cannot be made.
    pub fn new(root: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(root)?;
        Ok(Self { root: root.to_owned() })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn walk(&self, dir: &Path, found: &mut Vec<String>) -> io::Result<()> {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(error) => return Err(error),
        };
        for entry in entries {
            let path = entry?.path();
            if path.is_dir() {
                self.walk(&path, found)?;
            } else if let Ok(relative) = path.strip_prefix(&self.root) {
                let name = relative.to_string_lossy().replace('\\', "/");
                found.push(name);
            }
        }
        Ok(())
    }
}

impl Storage for LocalStorage {
    fn location(&self, path: &str) -> String {
        self.root.join(path).display().to_string()
    }

    fn put(&self, path: &str, bytes: Vec<u8>) -> io::Result<()> {
        self.put_with(path, &mut |file| file.write_all(&bytes)).map(|_| ())
    }

    fn put_with(&self, path: &str, write: &mut Fill<'_>) -> io::Result<u64> {
        let target = self.root.join(path);
        let dir = target.parent().unwrap_or(&self.root).to_owned();
        std::fs::create_dir_all(&dir)?;
        let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let temp = dir.join(format!("{name}.partial-{}", std::process::id()));
        let written = (|| {
            let mut file = io::BufWriter::with_capacity(1 << 20, File::create(&temp)?);
            write(&mut file)?;
            let file = file.into_inner().map_err(io::IntoInnerError::into_error)?;
            file.sync_all()?;
            file.metadata().map(|m| m.len())
        })();
        let length = match written {
            Ok(length) => length,
            Err(error) => {
                let _ = std::fs::remove_file(&temp);
                return Err(error);
            }
        };
        std::fs::rename(&temp, &target)?;
        File::open(&dir)?.sync_all()?;
        Ok(length)
    }

    fn get(&self, path: &str) -> io::Result<Option<Bytes>> {
        match std::fs::read(self.root.join(path)) {
            Ok(bytes) => Ok(Some(Bytes::from(bytes))),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error),
        }
    }

    fn get_range(&self, path: &str, range: Range<u64>) -> io::Result<Bytes> {
        let mut file = File::open(self.root.join(path))?;
        file.seek(SeekFrom::Start(range.start))?;
        let mut buffer = vec![0; (range.end - range.start) as usize];
        file.read_exact(&mut buffer)?;
        Ok(Bytes::from(buffer))
    }

    fn list(&self, prefix: &str) -> io::Result<Vec<String>> {
        let mut found = Vec::new();
        self.walk(&self.root.join(prefix), &mut found)?;
        found.sort();
        Ok(found)
    }

    fn delete(&self, path: &str) -> io::Result<()> {
        match std::fs::remove_file(self.root.join(path)) {
            Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
            _ => Ok(()),
        }
    }

    fn local_path(&self, path: &str) -> Option<PathBuf> {
        Some(self.root.join(path))
    }

    fn delete_prefix(&self, prefix: &str) -> io::Result<()> {
        match std::fs::remove_dir_all(self.root.join(prefix)) {
            Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
            _ => Ok(()),
        }
    }
}

/// S3-compatible object storage under a prefix.
pub struct ObjectStorage {
    store: Arc<dyn ObjectStore>,
    url: String,
    prefix: String,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
}

impl fmt::Debug for ObjectStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectStorage").field("url", &self.url).finish_non_exhaustive()
    }
}

impl Drop for ObjectStorage {
    fn drop(&mut self) {
        // Dropping a runtime inside another one's task panics; let it go in the background.
        if let Some(runtime) = self.runtime.lock().map(|mut r| r.take()).ok().flatten() {
            runtime.shutdown_background();
        }
    }
}

impl ObjectStorage {
    /// The storage of `url` (`s3://bucket[/prefix]`). Endpoint, region and credentials come
    /// from the standard `AWS_*` environment variables (`AWS_ENDPOINT`, `AWS_REGION`,
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_ALLOW_HTTP`).
    ///
    /// # Errors
    /// A URL that is not `s3://…`, or settings the client refuses.
    pub fn from_url(url: &str) -> io::Result<Self> {
        let parsed = url::Url::parse(url)
            .map_err(|error| io::Error::other(format!("warehouse URL {url}: {error}")))?;
        if !matches!(parsed.scheme(), "s3" | "s3a") || parsed.host_str().is_none() {
            return Err(io::Error::other(format!(
                "warehouse URL {url}: expected s3://bucket[/prefix]"
            )));
        }
        let bucket = parsed.host_str().unwrap_or_default().to_owned();
        let store = object_store::aws::AmazonS3Builder::from_env()
            .with_bucket_name(&bucket)
            .build()
            .map_err(|error| io::Error::other(format!("warehouse URL {url}: {error}")))?;
        let prefix = parsed.path().trim_matches('/').to_owned();
        Self::new(Arc::new(store), url, &prefix)
    }

    /// Bucket `bucket` of the S3-compatible server at `endpoint` (plain HTTP allowed), under
    /// `prefix`, signing with the given static credentials.
    ///
    /// # Errors
    /// Settings the client refuses, or a runtime that cannot start.
    pub fn at_endpoint(
        endpoint: &str,
        bucket: &str,
        prefix: &str,
        access_key_id: &str,
        secret_access_key: &str,
    ) -> io::Result<Self> {
        let store = object_store::aws::AmazonS3Builder::new()
            .with_endpoint(endpoint)
            .with_allow_http(true)
            .with_region("us-east-1")
            .with_bucket_name(bucket)
            .with_access_key_id(access_key_id)
            .with_secret_access_key(secret_access_key)
            .build()
            .map_err(io::Error::other)?;
        Self::new(Arc::new(store), &format!("s3://{bucket}/{prefix}"), prefix)
    }

    /// `store` under `prefix`.
    ///
    /// # Errors
    /// When its runtime cannot start.
    pub fn new(store: Arc<dyn ObjectStore>, url: &str, prefix: &str) -> io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("sluice-object-store")
            .enable_all()
            .build()?;
        Ok(Self {
            store,
            url: url.trim_end_matches('/').to_owned(),
            prefix: prefix.trim_matches('/').to_owned(),
            runtime: Mutex::new(Some(runtime)),
        })
    }

    /// The same store under `prefix` below this one's.
    ///
    /// # Errors
    /// When its runtime cannot start.
    pub fn child(&self, prefix: &str) -> io::Result<Self> {
        Self::new(
            self.store.clone(),
            &format!("{}/{prefix}", self.url),
            &self.full(prefix.trim_matches('/')),
        )
    }

    fn full(&self, path: &str) -> String {
        match (self.prefix.is_empty(), path.is_empty()) {
            (true, _) => path.to_owned(),
            (false, true) => self.prefix.clone(),
            (false, false) => format!("{}/{path}", self.prefix),
        }
    }

    fn object(&self, path: &str) -> ObjectPath {
        ObjectPath::from(self.full(path))
    }

    /// Runs `request` on this storage's runtime and waits for it (from any thread, async or
    /// not: the calling thread only blocks on a channel).
    fn run<T: Send + 'static>(
        &self,
        request: impl std::future::Future<Output = object_store::Result<T>> + Send + 'static,
    ) -> io::Result<T> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        {
            let runtime = self.runtime.lock().expect("not poisoned");
            let Some(runtime) = runtime.as_ref() else {
                return Err(io::Error::other("object storage is shutting down"));
            };
            runtime.spawn(async move {
                let _ = tx.send(request.await);
            });
        }
        let answer = rx.recv().map_err(|_| io::Error::other("object storage request lost"))?;
        answer.map_err(|error| match error {
            object_store::Error::NotFound { .. } => io::Error::new(io::ErrorKind::NotFound, error),
            other => io::Error::other(other),
        })
    }
}

impl Storage for ObjectStorage {
    fn location(&self, path: &str) -> String {
        format!("{}/{path}", self.url)
    }

    fn put(&self, path: &str, bytes: Vec<u8>) -> io::Result<()> {
        let (store, object) = (self.store.clone(), self.object(path));
        self.run(async move { store.put(&object, bytes.into()).await.map(|_| ()) })
    }

    fn get(&self, path: &str) -> io::Result<Option<Bytes>> {
        let (store, object) = (self.store.clone(), self.object(path));
        match self.run(async move { store.get(&object).await?.bytes().await }) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error),
        }
    }

    fn get_range(&self, path: &str, range: Range<u64>) -> io::Result<Bytes> {
        let (store, object) = (self.store.clone(), self.object(path));
        self.run(async move { store.get_range(&object, range).await })
    }

    fn list(&self, prefix: &str) -> io::Result<Vec<String>> {
        let store = self.store.clone();
        let under = self.full(prefix.trim_matches('/'));
        let root = if self.prefix.is_empty() { String::new() } else { format!("{}/", self.prefix) };
        let mut found = self.run(async move {
            let prefix = (!under.is_empty()).then(|| ObjectPath::from(under));
            let objects: Vec<_> = store.list(prefix.as_ref()).try_collect().await?;
            Ok(objects
                .into_iter()
                .map(|meta| {
                    let full = meta.location.to_string();
                    full.strip_prefix(&root).unwrap_or(&full).to_owned()
                })
                .collect::<Vec<_>>())
        })?;
        found.sort();
        Ok(found)
    }

    fn delete(&self, path: &str) -> io::Result<()> {
        let (store, object) = (self.store.clone(), self.object(path));
        match self.run(async move { store.delete(&object).await }) {
            Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
            _ => Ok(()),
        }
    }

    fn local_path(&self, _path: &str) -> Option<PathBuf> {
        None
    }
}

/// A parquet file of a storage, for the parquet reader: a local file is read in place; an
/// object is read by ranges, those [`ObjectReader::prefetch`]ed first fetched together. Clones
/// share the file and the fetched ranges.
#[derive(Clone)]
pub struct ObjectReader {
    source: Source,
    size: u64,
}

#[derive(Clone)]
enum Source {
    File(Arc<File>),
    Remote(Arc<Remote>),
}

struct Remote {
    storage: Arc<dyn Storage>,
    path: String,
    size: u64,
    /// Fetched ranges: `(start, bytes)`, sorted by start.
    cache: Mutex<Vec<(u64, Bytes)>>,
}

/// Reads of an object past what was prefetched go in blocks of this size.
const READ_BLOCK: u64 = 1 << 20;

impl Remote {
    /// Up to `length` bytes from `start`: what a fetched range holds from there, or a new
    /// range read.
    fn bytes_from(&self, start: u64, length: u64) -> io::Result<Bytes> {
        let end = (start + length).min(self.size);
        if start >= end {
            return Ok(Bytes::new());
        }
        {
            let cache = self.cache.lock().expect("not poisoned");
            if let Some((at, bytes)) = cache
                .iter()
                .rev()
                .find(|(at, bytes)| *at <= start && start < at + bytes.len() as u64)
            {
                let to = end.min(at + bytes.len() as u64);
                return Ok(bytes.slice((start - at) as usize..(to - at) as usize));
            }
        }
        self.storage.get_range(&self.path, start..end)
    }
}

impl ObjectReader {
    /// The file `path` of `size` bytes.
    ///
    /// # Errors
    /// A local file that cannot be opened.
    pub fn open(storage: &Arc<dyn Storage>, path: &str, size: u64) -> io::Result<Self> {
        let source = match storage.local_path(path) {
            Some(local) => Source::File(Arc::new(File::open(local)?)),
            None => Source::Remote(Arc::new(Remote {
                storage: storage.clone(),
                path: path.to_owned(),
                size,
                cache: Mutex::default(),
            })),
        };
        Ok(Self { source, size })
    }

    /// Fetches `ranges` (merged where they touch) so later reads inside them need no request.
    ///
    /// # Errors
    /// When a range cannot be read.
    pub fn prefetch(&self, mut ranges: Vec<Range<u64>>) -> io::Result<()> {
        let Source::Remote(remote) = &self.source else { return Ok(()) };
        ranges.sort_by_key(|r| r.start);
        let mut merged: Vec<Range<u64>> = Vec::new();
        for range in ranges {
            match merged.last_mut() {
                Some(last) if range.start <= last.end => last.end = last.end.max(range.end),
                _ => merged.push(range),
            }
        }
        let mut fetched = Vec::with_capacity(merged.len());
        for range in merged {
            let start = range.start;
            fetched.push((start, remote.storage.get_range(&remote.path, range)?));
        }
        let mut cache = remote.cache.lock().expect("not poisoned");
        cache.extend(fetched);
        cache.sort_by_key(|(start, _)| *start);
        Ok(())
    }
}

impl Length for ObjectReader {
    fn len(&self) -> u64 {
        self.size
    }
}

impl ChunkReader for ObjectReader {
    type T = Box<dyn Read + Send>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        match &self.source {
            Source::File(file) => Ok(Box::new(File::get_read(file, start)?)),
            Source::Remote(remote) => {
                Ok(Box::new(RangeRead { remote: remote.clone(), at: start, buffer: Bytes::new() }))
            }
        }
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        match &self.source {
            Source::File(file) => File::get_bytes(file, start, length),
            Source::Remote(remote) => {
                let first = remote.bytes_from(start, length as u64)?;
                if first.len() == length {
                    return Ok(first);
                }
                // Across the end of a fetched range: the rest by a range read.
                let mut whole = first.to_vec();
                let rest = remote.storage.get_range(
                    &remote.path,
                    start + first.len() as u64..(start + length as u64).min(remote.size),
                )?;
                whole.extend_from_slice(&rest);
                Ok(Bytes::from(whole))
            }
        }
    }
}

/// Reads an object on from an offset, a fetched range or a block at a time.
struct RangeRead {
    remote: Arc<Remote>,
    at: u64,
    buffer: Bytes,
}

impl Read for RangeRead {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.buffer.is_empty() {
            self.buffer = self.remote.bytes_from(self.at, READ_BLOCK)?;
            self.at += self.buffer.len() as u64;
        }
        let n = self.buffer.len().min(buf.len());
        buf[..n].copy_from_slice(&self.buffer[..n]);
        self.buffer.advance(n);
        Ok(n)
    }
}

/// For tests against a local S3-compatible server that makes a bucket on an unsigned `PUT`
/// (moto's server mode, as `scripts/test` starts it).
#[doc(hidden)]
pub mod testing {
    use std::io::{Read as _, Write as _};
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::ObjectStorage;

    /// A new, empty bucket of the server at `SLUICE_TEST_S3_URL`, as storage under `prefix`.
    ///
    /// # Panics
    /// Without `SLUICE_TEST_S3_URL`, or when the bucket cannot be made.
    pub fn new_bucket(prefix: &str) -> ObjectStorage {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let endpoint = std::env::var("SLUICE_TEST_S3_URL").expect(
            "SLUICE_TEST_S3_URL must name the S3-compatible server (scripts/test starts moto)",
        );
        let bucket =
            format!("sluice-test-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let host = endpoint.trim_start_matches("http://").trim_end_matches('/');
        let mut stream = std::net::TcpStream::connect(host).expect("the S3 server answers");
        write!(
            stream,
            "PUT /{bucket} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .expect("a request is sent");
        let mut answer = String::new();
        stream.read_to_string(&mut answer).expect("an answer");
        assert!(answer.starts_with("HTTP/1.1 200"), "creating bucket {bucket}: {answer}");
        ObjectStorage::at_endpoint(&endpoint, &bucket, prefix, "test", "test")
            .expect("a storage of the bucket")
    }
}
