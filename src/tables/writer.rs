//! One task per `[[tables]]` entry: reads the pattern's stored messages in offset order
//! from the store and appends them to the table in commits, each recording the last
//! offset it holds in its snapshot summary ([`COMMITTED_OFFSET`]).
//!
//! Exactly once: a commit is one catalog swap, and a restart (or a failed commit)
//! reads the committed offset from the table and goes on after it; data files a
//! crash left unreferenced are never read. Memory is bounded by `commit_mib` plus one
//! replay page. Must never write to the store.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use canopy_subjects::Pattern;
use iceberg::spec::{DataFileFormat, Literal, PartitionKey, Struct};
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use iceberg::{Catalog, CatalogBuilder, NamespaceIdent, TableCreation, TableIdent};
use iceberg_catalog_sql::{SqlBindStyle, SqlCatalog, SqlCatalogBuilder};

use super::object_catalog::ObjectCatalog;
use super::object_io::ObjectIo;
use parquet::file::properties::WriterProperties;
use tokio_util::sync::CancellationToken;

use super::{
    COMMITTED_OFFSET, Column, batch, columns, columns_of_table, day_of, iceberg_schema,
    partition_spec,
};
use crate::config::TableConfig;
use crate::store::{ReplayFrom, Store, StoreError, StoredMessage};

/// The catalog's name, as readers must give it too (pyiceberg's `SqlCatalog("canopy", …)`).
pub const CATALOG_NAME: &str = "canopy";
/// Messages read from the store per page.
const PAGE: usize = 1_000;
/// Wait between attempts after a failure, and between reads when caught up.
const RETRY: Duration = Duration::from_secs(1);
const IDLE: Duration = Duration::from_millis(200);

#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("iceberg: {0}")]
    Iceberg(#[from] iceberg::Error),
    #[error("the store: {0}")]
    Store(#[from] StoreError),
    #[error("arrow: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    #[error("{0}")]
    Setup(String),
}

/// Where a table's catalog and files go.
pub enum Place {
    /// A folder with `catalog.db` (SQLite) and `warehouse/`: the table's own
    /// `folder`, else `tables/` in a local store's folder.
    Local(PathBuf),
    /// `tables/` under the prefix of a store on S3, in the same bucket, with the
    /// catalog in the bucket too (`object_catalog`).
    Bucket { io: ObjectIo, root: String },
}

impl Place {
    /// Where `table` goes on a store at `store`.
    pub fn of(
        table: &TableConfig,
        store: &crate::config::StoreConfig,
    ) -> Result<Place, TableError> {
        if let Some(folder) = &table.folder {
            return Ok(Place::Local(folder.clone()));
        }
        match store.url.parse::<crate::store::StoreUrl>() {
            Ok(crate::store::StoreUrl::File(path)) => Ok(Place::Local(path.join("tables"))),
            Ok(crate::store::StoreUrl::S3 { bucket, prefix }) => {
                let client = crate::store::s3_client(&bucket, &store.s3)?;
                let root = format!("s3://{bucket}");
                let tables = match prefix.as_str() {
                    "" => format!("{root}/tables"),
                    prefix => format!("{root}/{prefix}/tables"),
                };
                Ok(Place::Bucket {
                    io: ObjectIo::new(&root, client),
                    root: tables,
                })
            }
            _ => Err(TableError::Setup(format!(
                "table {}: the store is in memory, so give the table a `folder`",
                table.table
            ))),
        }
    }

    /// Opens (creating when missing) the place's catalog.
    pub async fn catalog(&self) -> Result<Arc<dyn Catalog>, TableError> {
        match self {
            Place::Local(folder) => Ok(Arc::new(open_catalog(folder).await?)),
            Place::Bucket { io, root } => Ok(Arc::new(ObjectCatalog::new(io.clone(), root))),
        }
    }
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Local(folder) => write!(f, "{}", folder.display()),
            Place::Bucket { root, .. } => f.write_str(root),
        }
    }
}

/// Opens (creating when missing) the SQL catalog in `folder`.
pub async fn open_catalog(folder: &Path) -> Result<SqlCatalog, TableError> {
    std::fs::create_dir_all(folder.join("warehouse"))
        .map_err(|e| TableError::Setup(format!("cannot make {}: {e}", folder.display())))?;
    let folder = std::fs::canonicalize(folder)
        .map_err(|e| TableError::Setup(format!("cannot find {}: {e}", folder.display())))?;
    let catalog = SqlCatalogBuilder::default()
        .with_storage_factory(Arc::new(iceberg::io::LocalFsStorageFactory))
        .uri(format!(
            "sqlite:{}?mode=rwc",
            folder.join("catalog.db").display()
        ))
        .warehouse_location(format!("file://{}", folder.join("warehouse").display()))
        .sql_bind_style(SqlBindStyle::QMark)
        .load(CATALOG_NAME, HashMap::new())
        .await?;
    Ok(catalog)
}

/// One table being written.
struct Writer {
    config: TableConfig,
    tenant: String,
    pattern: Pattern,
    /// The tenant's bindings: the one of the pattern, when the table is made, gives
    /// its columns.
    schemas: Arc<crate::schemas::TenantSchemas>,
    columns: Vec<Column>,
    catalog: Arc<dyn Catalog>,
    ident: TableIdent,
    /// Made at the first commit, so a schema bound after the start still counts.
    table: Option<iceberg::table::Table>,
    /// Unique per run, so a crashed run's unreferenced files are never overwritten.
    file_prefix: String,
}

/// Starts the writer of every configured table; each logs and retries its own
/// failures, so a table that cannot be written never stops the server.
pub fn start(
    store: Arc<Store>,
    schemas: &crate::schemas::Registry,
    tables: &[TableConfig],
    store_config: &crate::config::StoreConfig,
    tracker: &tokio_util::task::TaskTracker,
    shutdown: CancellationToken,
) {
    for config in tables {
        let schemas = schemas.tenant(&config.tenant);
        let place = Place::of(config, store_config);
        let store = Arc::clone(&store);
        let config = config.clone();
        let shutdown = shutdown.clone();
        // Tracked with the connections, so the store closes after the last commit.
        tracker.spawn(async move {
            let place = match place {
                Ok(place) => place,
                Err(error) => {
                    tracing::error!(table = %config.table, %error, "table not written");
                    return;
                }
            };
            run(store, config, place, schemas, shutdown).await;
        });
    }
}

async fn run(
    store: Arc<Store>,
    config: TableConfig,
    place: Place,
    schemas: Arc<crate::schemas::TenantSchemas>,
    shutdown: CancellationToken,
) {
    let mut writer = loop {
        match Writer::open(&config, &place, Arc::clone(&schemas)).await {
            Ok(writer) => break writer,
            Err(error) => {
                tracing::warn!(table = %config.table, %error, "cannot open the table; retrying");
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(RETRY * 5) => {}
                }
            }
        }
    };
    tracing::info!(table = %config.table, at = %place, "writing table");
    loop {
        match writer.follow(&store, &shutdown).await {
            Ok(()) => return,
            Err(error) => {
                tracing::warn!(table = %config.table, %error, "a table commit failed; going on from the last committed offset");
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(RETRY) => {}
                }
                if let Err(error) = writer.reload().await {
                    tracing::warn!(table = %config.table, %error, "cannot reload the table");
                }
            }
        }
    }
}

impl Writer {
    async fn open(
        config: &TableConfig,
        place: &Place,
        schemas: Arc<crate::schemas::TenantSchemas>,
    ) -> Result<Writer, TableError> {
        let pattern = Pattern::parse_native(&config.pattern)
            .map_err(|e| TableError::Setup(format!("pattern: {e}")))?;
        let (namespace, name) = config
            .ident()
            .ok_or_else(|| TableError::Setup(format!("table name {}", config.table)))?;
        let catalog = place.catalog().await?;
        let namespace = NamespaceIdent::new(namespace.to_owned());
        if !catalog.namespace_exists(&namespace).await? {
            catalog.create_namespace(&namespace, HashMap::new()).await?;
        }
        let ident = TableIdent::new(namespace, name.to_owned());
        let mut suffix = [0u8; 8];
        getrandom::fill(&mut suffix).map_err(|e| TableError::Setup(format!("random: {e}")))?;
        let mut writer = Writer {
            config: config.clone(),
            tenant: config.tenant.clone(),
            pattern,
            schemas,
            columns: Vec::new(),
            catalog,
            ident,
            table: None,
            file_prefix: format!(
                "canopy-{}",
                suffix
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<String>()
            ),
        };
        writer.reload().await?;
        Ok(writer)
    }

    /// The columns of the table as made.
    fn columns_of(&self, table: &iceberg::table::Table) -> Vec<Column> {
        columns_of_table(
            &self.pattern,
            &self.config.columns,
            table.metadata().current_schema(),
        )
    }

    /// The table, made now with the pattern's binding's fields if it does not exist.
    async fn table(&mut self) -> Result<iceberg::table::Table, TableError> {
        if let Some(table) = &self.table {
            return Ok(table.clone());
        }
        let schema = self
            .schemas
            .current()
            .get(&self.config.pattern)
            .and_then(|b| b.stored.schema.clone());
        let wanted = columns(&self.pattern, &self.config.columns, schema.as_ref());
        let creation = TableCreation::builder()
            .name(self.ident.name().to_owned())
            .schema(iceberg_schema(&wanted)?)
            .partition_spec(partition_spec(&wanted)?)
            .properties([
                ("canopy.pattern".to_owned(), self.config.pattern.clone()),
                ("canopy.tenant".to_owned(), self.config.tenant.clone()),
            ])
            .build();
        let table = self
            .catalog
            .create_table(self.ident.namespace(), creation)
            .await?;
        self.columns = self.columns_of(&table);
        self.table = Some(table.clone());
        Ok(table)
    }

    /// Reads the table again from the catalog (after a failed commit, and at start).
    async fn reload(&mut self) -> Result<(), TableError> {
        self.table = if self.catalog.table_exists(&self.ident).await? {
            let table = self.catalog.load_table(&self.ident).await?;
            self.columns = self.columns_of(&table);
            Some(table)
        } else {
            None
        };
        Ok(())
    }

    /// The last offset the table holds (0: none).
    fn committed(&self) -> u64 {
        self.table
            .as_ref()
            .and_then(|t| t.metadata().current_snapshot())
            .and_then(|s| s.summary().additional_properties.get(COMMITTED_OFFSET))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// Reads from the store after the committed offset and commits, until shutdown.
    async fn follow(
        &mut self,
        store: &Store,
        shutdown: &CancellationToken,
    ) -> Result<(), TableError> {
        let max_bytes =
            usize::try_from(self.config.commit_mib.saturating_mul(1 << 20)).unwrap_or(usize::MAX);
        let every = Duration::from_secs(self.config.commit_secs);
        let mut next = self.committed() + 1;
        let mut waiting: Vec<StoredMessage> = Vec::new();
        let mut bytes = 0usize;
        let mut since = Instant::now();
        loop {
            if shutdown.is_cancelled() {
                if !waiting.is_empty() {
                    self.commit(std::mem::take(&mut waiting)).await?;
                }
                return Ok(());
            }
            let page = store
                .replay_pattern(
                    &self.tenant,
                    &self.pattern,
                    ReplayFrom::Offset(next),
                    PAGE,
                    crate::session::PAGE_BYTES,
                )
                .await?;
            next = page.next.max(next);
            for message in page.messages {
                bytes += message.payload.len() + message.headers.len();
                waiting.push(message);
            }
            let due = !waiting.is_empty() && since.elapsed() >= every;
            if bytes >= max_bytes || due {
                self.commit(std::mem::take(&mut waiting)).await?;
                bytes = 0;
                since = Instant::now();
            }
            if waiting.is_empty() {
                since = Instant::now();
            }
            if page.caught_up {
                tokio::select! {
                    () = shutdown.cancelled() => {}
                    () = tokio::time::sleep(IDLE) => {}
                }
            }
        }
    }

    /// Writes `messages` (in offset order) as one data file per day and commits them
    /// with the last offset.
    async fn commit(&mut self, messages: Vec<StoredMessage>) -> Result<(), TableError> {
        let Some(last) = messages.last().map(|m| m.offset) else {
            return Ok(());
        };
        let table = self.table().await?;
        let metadata = table.metadata();
        let schema = metadata.current_schema().clone();
        let arrow_schema = Arc::new(iceberg::arrow::schema_to_arrow_schema(&schema)?);
        let spec = metadata.default_partition_spec().as_ref().clone();
        let mut by_day: BTreeMap<i32, Vec<&StoredMessage>> = BTreeMap::new();
        for message in &messages {
            by_day.entry(day_of(message)).or_default().push(message);
        }
        let mut files = Vec::new();
        for (day, rows) in by_day {
            let parquet = ParquetWriterBuilder::new(WriterProperties::default(), schema.clone());
            let rolling = RollingFileWriterBuilder::new_with_default_file_size(
                parquet,
                table.file_io().clone(),
                DefaultLocationGenerator::new(metadata)?,
                DefaultFileNameGenerator::new(
                    self.file_prefix.clone(),
                    Some(format!("{last}")),
                    DataFileFormat::Parquet,
                ),
            );
            let key = PartitionKey::new(
                spec.clone(),
                schema.clone(),
                Struct::from_iter([Some(Literal::date(day))]),
            );
            let mut writer = DataFileWriterBuilder::new(rolling).build(Some(key)).await?;
            writer
                .write(batch(&self.columns, &arrow_schema, &rows)?)
                .await?;
            files.extend(writer.close().await?);
        }
        let tx = Transaction::new(&table);
        let tx = tx
            .fast_append()
            .add_data_files(files)
            .set_snapshot_properties(HashMap::from([(
                COMMITTED_OFFSET.to_owned(),
                last.to_string(),
            )]))
            .apply(tx)?;
        self.table = Some(tx.commit(&*self.catalog).await?);
        tracing::debug!(table = %self.config.table, rows = messages.len(), last, "table commit");
        Ok(())
    }
}
