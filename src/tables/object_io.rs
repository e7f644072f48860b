//! Iceberg's file access (`iceberg::io::Storage`) over an `object_store` bucket, so a
//! table's Parquet files and metadata go to the same S3 bucket as the store, through
//! the same client settings. iceberg 0.10 itself reaches only local files and memory.
//!
//! Locations are URLs under one root (`s3://bucket`); a location outside it is an
//! error, never a guess. Must never buffer a whole data file: writes stream through
//! a multipart upload.

use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use iceberg::io::{
    FileIO, FileIOBuilder, FileMetadata, FileRead, FileWrite, InputFile, OutputFile, Storage,
    StorageConfig, StorageFactory,
};
use iceberg::{Error, ErrorKind, Result};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

/// A bucket as Iceberg storage. Serializable because iceberg's storage traits ask for
/// it; the client itself is not carried, so a copy made by deserializing refuses
/// every call.
#[derive(Clone, Serialize, Deserialize)]
pub struct ObjectIo {
    /// The URL the bucket's keys hang from, without a trailing `/` (`s3://bucket`).
    root: String,
    #[serde(skip)]
    store: Option<Arc<dyn ObjectStore>>,
}

impl std::fmt::Debug for ObjectIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectIo")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

impl ObjectIo {
    pub fn new(root: &str, store: Arc<dyn ObjectStore>) -> ObjectIo {
        ObjectIo {
            root: root.trim_end_matches('/').to_owned(),
            store: Some(store),
        }
    }

    /// A `FileIO` for tables on this bucket.
    pub fn file_io(&self) -> FileIO {
        FileIOBuilder::new(Arc::new(ObjectIoFactory { io: self.clone() })).build()
    }

    fn store(&self) -> Result<&Arc<dyn ObjectStore>> {
        self.store.as_ref().ok_or_else(|| {
            Error::new(
                ErrorKind::Unexpected,
                "object storage was copied without its client",
            )
        })
    }

    /// The key of `location` in the bucket.
    pub fn key(&self, location: &str) -> Result<Path> {
        let key = location
            .strip_prefix(&self.root)
            .and_then(|rest| rest.strip_prefix('/'))
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::DataInvalid,
                    format!("{location} is not under {}", self.root),
                )
            })?;
        Path::parse(key).map_err(|e| {
            Error::new(ErrorKind::DataInvalid, format!("{location}: {e}")).with_source(e)
        })
    }

    /// Writes `bytes` at `location` only if nothing is there yet: `Ok(false)` when
    /// something was. The catalog's commits are these.
    pub async fn create(&self, location: &str, bytes: Bytes) -> Result<bool> {
        let options = object_store::PutOptions {
            mode: object_store::PutMode::Create,
            ..Default::default()
        };
        match self
            .store()?
            .put_opts(&self.key(location)?, bytes.into(), options)
            .await
        {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. })
            | Err(object_store::Error::Precondition { .. }) => Ok(false),
            Err(e) => Err(io_error(location, e)),
        }
    }

    /// The bytes at `location`, `None` when there are none.
    pub async fn read_if_any(&self, location: &str) -> Result<Option<Bytes>> {
        match self.store()?.get(&self.key(location)?).await {
            Ok(found) => Ok(Some(
                found.bytes().await.map_err(|e| io_error(location, e))?,
            )),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(io_error(location, e)),
        }
    }

    /// The locations of the objects under `location`.
    pub async fn list(&self, location: &str) -> Result<Vec<String>> {
        let prefix = self.key(location)?;
        let mut listed = self.store()?.list(Some(&prefix));
        let mut found = Vec::new();
        while let Some(meta) = listed.next().await {
            let meta = meta.map_err(|e| io_error(location, e))?;
            found.push(format!("{}/{}", self.root, meta.location));
        }
        Ok(found)
    }
}

fn io_error(location: &str, e: object_store::Error) -> Error {
    let kind = match e {
        object_store::Error::NotFound { .. } => ErrorKind::DataInvalid,
        _ => ErrorKind::Unexpected,
    };
    // Never retryable: iceberg's commit would retry an append whose first try may
    // have landed, and the writer reloads the table instead.
    Error::new(kind, format!("{location}: {e}")).with_source(e)
}

#[async_trait]
#[typetag::serde]
impl Storage for ObjectIo {
    async fn exists(&self, path: &str) -> Result<bool> {
        match self.store()?.head(&self.key(path)?).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(io_error(path, e)),
        }
    }

    async fn metadata(&self, path: &str) -> Result<FileMetadata> {
        let meta = self
            .store()?
            .head(&self.key(path)?)
            .await
            .map_err(|e| io_error(path, e))?;
        Ok(FileMetadata { size: meta.size })
    }

    async fn read(&self, path: &str) -> Result<Bytes> {
        let found = self
            .store()?
            .get(&self.key(path)?)
            .await
            .map_err(|e| io_error(path, e))?;
        found.bytes().await.map_err(|e| io_error(path, e))
    }

    async fn reader(&self, path: &str) -> Result<Box<dyn FileRead>> {
        Ok(Box::new(ObjectRead {
            store: Arc::clone(self.store()?),
            key: self.key(path)?,
            location: path.to_owned(),
        }))
    }

    async fn write(&self, path: &str, bs: Bytes) -> Result<()> {
        self.store()?
            .put(&self.key(path)?, bs.into())
            .await
            .map_err(|e| io_error(path, e))?;
        Ok(())
    }

    async fn writer(&self, path: &str) -> Result<Box<dyn FileWrite>> {
        Ok(Box::new(ObjectWrite {
            upload: Some(object_store::buffered::BufWriter::new(
                Arc::clone(self.store()?),
                self.key(path)?,
            )),
            location: path.to_owned(),
        }))
    }

    async fn delete(&self, path: &str) -> Result<()> {
        match self.store()?.delete(&self.key(path)?).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(io_error(path, e)),
        }
    }

    async fn delete_prefix(&self, path: &str) -> Result<()> {
        for location in self.list(path).await? {
            self.delete(&location).await?;
        }
        Ok(())
    }

    async fn delete_stream(&self, mut paths: BoxStream<'static, String>) -> Result<()> {
        while let Some(path) = paths.next().await {
            self.delete(&path).await?;
        }
        Ok(())
    }

    fn new_input(&self, path: &str) -> Result<InputFile> {
        Ok(InputFile::new(Arc::new(self.clone()), path.to_owned()))
    }

    fn new_output(&self, path: &str) -> Result<OutputFile> {
        Ok(OutputFile::new(Arc::new(self.clone()), path.to_owned()))
    }
}

/// Hands out the one [`ObjectIo`] it was made with, whatever the properties.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ObjectIoFactory {
    io: ObjectIo,
}

#[typetag::serde]
impl StorageFactory for ObjectIoFactory {
    fn build(&self, _config: &StorageConfig) -> Result<Arc<dyn Storage>> {
        self.io.store()?;
        Ok(Arc::new(self.io.clone()))
    }
}

struct ObjectRead {
    store: Arc<dyn ObjectStore>,
    key: Path,
    location: String,
}

#[async_trait]
impl FileRead for ObjectRead {
    async fn read(&self, range: Range<u64>) -> Result<Bytes> {
        self.store
            .get_range(&self.key, range)
            .await
            .map_err(|e| io_error(&self.location, e))
    }
}

/// A multipart upload: parts go out as they fill, the object appears at `close`.
struct ObjectWrite {
    upload: Option<object_store::buffered::BufWriter>,
    location: String,
}

#[async_trait]
impl FileWrite for ObjectWrite {
    async fn write(&mut self, bs: Bytes) -> Result<()> {
        let upload = self.upload.as_mut().ok_or_else(|| {
            Error::new(
                ErrorKind::Unexpected,
                format!("{} is closed", self.location),
            )
        })?;
        upload
            .put(bs)
            .await
            .map_err(|e| io_error(&self.location, e))
    }

    async fn close(&mut self) -> Result<()> {
        let mut upload = self.upload.take().ok_or_else(|| {
            Error::new(
                ErrorKind::Unexpected,
                format!("{} is closed", self.location),
            )
        })?;
        upload.shutdown().await.map_err(|e| {
            Error::new(ErrorKind::Unexpected, format!("{}: {e}", self.location)).with_source(e)
        })
    }
}
