//! One task per `[[tables]]` entry: follows the pattern's stored messages in offset
//! order and appends them to the table in commits, each recording the last offset it
//! holds in its snapshot summary ([`COMMITTED_OFFSET`]). It reads them from the store
//! through a durable [`Follower`] of the tenant's log: from the store to catch up (at
//! start, after a failure, or when it fell behind), then live from the sequencer.
//!
//! Exactly once: a commit is one catalog swap, and a restart (or a failed commit)
//! reads the committed offset from the table and goes on after it; data files a
//! crash left unreferenced are never read. The follower hands out only stored
//! messages, in offset order, with none missing. Memory is bounded by about four
//! times `commit_mib` (twice waiting, and the running commit's messages and their
//! rows) plus one page and the follower's queue. Must never write to the store.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use canopy_subjects::Pattern;
use iceberg::spec::{DataFileFormat, Literal, PartitionKey, Struct};
use iceberg::transaction::{AddColumn, ApplyTransactionAction, Transaction};
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
use crate::follow::{Follower, Taps, Target};
use crate::store::{ReplayFrom, Store, StoreError, StoredMessage};

/// Payload and header bytes a table's follower queues at most.
pub const QUEUE_BYTES: usize = 64 << 20;

/// The catalog's name, as readers must give it too (pyiceberg's `SqlCatalog("canopy", …)`).
pub const CATALOG_NAME: &str = "canopy";
/// Messages the follower gives at a time.
const PAGE: usize = 4_096;
/// Wait between attempts after a failure.
const RETRY: Duration = Duration::from_secs(1);

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

/// The messages a writer holds and has not committed, in offset order.
#[derive(Default)]
struct Held {
    waiting: Vec<StoredMessage>,
    bytes: usize,
    /// Since when the oldest of `waiting` has waited.
    since: Option<Instant>,
}

impl Held {
    fn push(&mut self, message: StoredMessage) {
        self.since.get_or_insert_with(Instant::now);
        self.bytes += size(&message);
        self.waiting.push(message);
    }

    /// Everything held, for a commit.
    fn take(&mut self) -> Vec<StoredMessage> {
        self.bytes = 0;
        self.since = None;
        std::mem::take(&mut self.waiting)
    }
}

fn size(message: &StoredMessage) -> usize {
    message.payload.len() + message.headers.len()
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
    /// The tenant's store, asked before each commit whether its subjects are sealed.
    store: Arc<Store>,
    /// The tenant's plugins, asked before each commit whether a deliver plugin
    /// filters its subjects.
    plugins: Arc<crate::plugins::TenantPlugins>,
}

/// What a writer takes of its tenant.
pub struct TenantParts {
    /// Its schema bindings: the one of the pattern, when the table is made, gives its
    /// columns.
    pub schemas: Arc<crate::schemas::TenantSchemas>,
    /// The taps its follower registers with, to be offered each stored message.
    pub taps: Arc<Taps>,
    /// Its plugins: a table is not written under a deliver plugin, which it would go
    /// around.
    pub plugins: Arc<crate::plugins::TenantPlugins>,
}

/// Starts the writer of every configured table; each logs and retries its own
/// failures, so a table that cannot be written never stops the server.
pub fn start(
    store: Arc<Store>,
    tenant_of: &dyn Fn(&str) -> TenantParts,
    tables: &[TableConfig],
    store_config: &crate::config::StoreConfig,
    tracker: &tokio_util::task::TaskTracker,
    shutdown: CancellationToken,
) {
    for config in tables {
        let parts = tenant_of(&config.tenant);
        let place = Place::of(config, store_config);
        let store = Arc::clone(&store);
        let config = config.clone();
        let shutdown = shutdown.clone();
        let place = match place {
            Ok(place) => place,
            Err(error) => {
                tracing::error!(table = %config.table, %error, "table not written");
                continue;
            }
        };
        match Pattern::parse_native(&config.pattern) {
            Ok(_) => {}
            Err(error) => {
                tracing::error!(table = %config.table, %error, "table not written: its pattern");
                continue;
            }
        };
        // Tracked with the connections, so the store closes after the last commit.
        tracker.spawn(async move {
            run(store, config, place, parts, shutdown).await;
        });
    }
}

async fn run(
    store: Arc<Store>,
    config: TableConfig,
    place: Place,
    parts: TenantParts,
    shutdown: CancellationToken,
) {
    let taps = Arc::clone(&parts.taps);
    let mut writer = loop {
        match Writer::open(&config, &place, &parts, Arc::clone(&store)).await {
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
        match writer.follow(&store, &taps, &shutdown).await {
            Ok(()) => return,
            Err(error) => {
                tracing::warn!(table = %config.table, %error, "a table commit failed; going on from the last committed offset");
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(RETRY) => {}
                }
                // Only from what the table holds: a commit that landed though it
                // seemed to fail must not be repeated.
                while let Err(error) = writer.reload().await {
                    tracing::warn!(table = %config.table, %error, "cannot reload the table; retrying");
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(RETRY) => {}
                    }
                }
            }
        }
    }
}

impl Writer {
    async fn open(
        config: &TableConfig,
        place: &Place,
        parts: &TenantParts,
        store: Arc<Store>,
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
            schemas: Arc::clone(&parts.schemas),
            plugins: Arc::clone(&parts.plugins),
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
            store,
        };
        writer.reload().await?;
        Ok(writer)
    }

    /// The columns of the table as its current schema has them.
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

    /// Adds a column for each top-level field of the pattern's current schema that
    /// the table lacks, as an optional column (its older rows hold none). Columns are
    /// never dropped or retyped: a field the schema lost stays, empty from then on,
    /// and a field whose type changed keeps its column's (values that do not fit it
    /// are left empty).
    async fn add_new_fields(
        &mut self,
        table: iceberg::table::Table,
    ) -> Result<iceberg::table::Table, TableError> {
        let schema = self
            .schemas
            .current()
            .get(&self.config.pattern)
            .and_then(|b| b.stored.schema.clone());
        let Some(schema) = schema else {
            return Ok(table);
        };
        let wanted = columns(&self.pattern, &self.config.columns, Some(&schema));
        let added: Vec<(String, super::FieldKind)> = wanted
            .into_iter()
            .filter_map(|column| match column {
                Column::Field { name, kind }
                    if !self.columns.iter().any(|have| have.name() == name) =>
                {
                    Some((name, kind))
                }
                _ => None,
            })
            .collect();
        if added.is_empty() {
            return Ok(table);
        }
        let tx = Transaction::new(&table);
        let action = added
            .iter()
            .fold(tx.update_schema(), |action, (name, kind)| {
                action.add_column(AddColumn::optional(
                    name,
                    iceberg::spec::Type::Primitive(super::field_type(*kind)),
                ))
            });
        let table = action.apply(tx)?.commit(&*self.catalog).await?;
        let added: Vec<&str> = added.iter().map(|(name, _)| name.as_str()).collect();
        tracing::info!(table = %self.config.table, columns = ?added, "table columns added from the schema");
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
        self.table.as_ref().map_or(0, committed_of)
    }

    /// Follows the pattern's messages after the committed offset and commits them,
    /// until shutdown. One commit at a time runs beside the following, so the
    /// follower's queue is drained while a commit writes its files; whatever ends the
    /// following waits for that commit first, so a retry starts from what the table
    /// then holds.
    async fn follow(
        &mut self,
        store: &Arc<Store>,
        taps: &Arc<Taps>,
        shutdown: &CancellationToken,
    ) -> Result<(), TableError> {
        let from = ReplayFrom::Offset(self.committed() + 1);
        let mut follower = Follower::new(
            Arc::clone(store),
            Arc::from(self.tenant.as_str()),
            Target::Pattern(self.pattern.clone()),
            from,
        )
        .pages_of(PAGE, crate::store::PAGE_BYTES)
        .tapped(taps, QUEUE_BYTES, true);
        let mut running = None;
        let result = self
            .follow_with(&mut follower, shutdown, &mut running)
            .await;
        if let Some(commit) = running.take() {
            let finished = self.finished(commit.await);
            if result.is_ok() {
                finished?;
            }
        }
        result
    }

    async fn follow_with(
        &mut self,
        follower: &mut Follower,
        shutdown: &CancellationToken,
        running: &mut Option<Running>,
    ) -> Result<(), TableError> {
        let max_bytes =
            usize::try_from(self.config.commit_mib.saturating_mul(1 << 20)).unwrap_or(usize::MAX);
        let every = Duration::from_secs(self.config.commit_secs);
        let mut held = Held::default();
        loop {
            if running.as_ref().is_some_and(|r| r.is_finished())
                && let Some(commit) = running.take()
            {
                self.finished(commit.await)?;
            }
            if shutdown.is_cancelled() {
                if let Some(commit) = running.take() {
                    self.finished(commit.await)?;
                }
                if !held.waiting.is_empty() {
                    let job = self.job().await?;
                    self.table = Some(job.run(held.take()).await?);
                }
                return Ok(());
            }
            let due = held.since.map(|since| since + every);
            tokio::select! {
                page = follower.next() => {
                    for message in page?.messages {
                        held.push(message);
                    }
                }
                joined = async {
                    match running.as_mut() {
                        Some(commit) => commit.await,
                        None => std::future::pending().await,
                    }
                }, if running.is_some() => {
                    *running = None;
                    self.finished(joined)?;
                }
                () = async {
                    match due {
                        Some(due) => tokio::time::sleep_until(due.into()).await,
                        None => std::future::pending().await,
                    }
                }, if running.is_none() => {}
                () = shutdown.cancelled() => {}
            }
            let due = held.since.is_some_and(|since| since.elapsed() >= every);
            if held.bytes >= max_bytes || due {
                // Twice a commit's worth waiting: no more until the running one ends.
                if held.bytes >= max_bytes.saturating_mul(2)
                    && let Some(commit) = running.take()
                {
                    self.finished(commit.await)?;
                }
                if running.is_none() && !held.waiting.is_empty() {
                    let job = self.job().await?;
                    *running = Some(tokio::spawn(job.run(held.take())));
                }
            }
        }
    }

    /// Takes a finished commit's table as the writer's.
    fn finished(
        &mut self,
        joined: Result<Result<iceberg::table::Table, TableError>, tokio::task::JoinError>,
    ) -> Result<(), TableError> {
        let table = joined.map_err(|e| TableError::Setup(format!("a commit task: {e}")))??;
        self.table = Some(table);
        Ok(())
    }

    /// What a commit needs of the writer (making the table at the first, and adding
    /// the columns of fields the binding gained since).
    async fn job(&mut self) -> Result<CommitJob, TableError> {
        // A table is read around any deliver plugin: none is written under one, as
        // the API refuses history reads under one.
        let deliver = self.plugins.current();
        if let Some(plugin) = deliver.all().iter().find(|p| {
            p.serves(crate::plugins::Hook::Deliver)
                && crate::streams::filters::overlap(&p.spec.pattern, &self.config.pattern)
        }) {
            return Err(TableError::Setup(format!(
                "a deliver plugin on {} filters what readers of {} see: a table would hold its \
                 messages unfiltered, so none are written while it is bound",
                plugin.spec.pattern, self.config.pattern
            )));
        }
        // A table is files in clear: the subjects of a sealed pattern never go there.
        if let Some(key) = self.store.data_keys(&self.tenant).iter().find(|k| {
            k.sealing && crate::streams::filters::overlap(&k.pattern, &self.config.pattern)
        }) {
            return Err(TableError::Setup(format!(
                "{} is sealed at rest (data key {}): a table would hold its messages in clear, so                  none are written while it is",
                key.pattern, key.id
            )));
        }
        let table = self.table().await?;
        let table = self.add_new_fields(table).await?;
        Ok(CommitJob {
            base: committed_of(&table),
            table,
            catalog: Arc::clone(&self.catalog),
            columns: self.columns.clone(),
            file_prefix: self.file_prefix.clone(),
            name: self.config.table.clone(),
        })
    }
}

/// The last offset `table` holds (0: none).
fn committed_of(table: &iceberg::table::Table) -> u64 {
    table
        .metadata()
        .current_snapshot()
        .and_then(|s| s.summary().additional_properties.get(COMMITTED_OFFSET))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A commit running beside the writer, with the table it made.
type Running = tokio::task::JoinHandle<Result<iceberg::table::Table, TableError>>;

/// One commit: what it needs to write its files and swap the table's metadata.
struct CommitJob {
    /// The offset the table must still hold as its last when the commit lands.
    base: u64,
    table: iceberg::table::Table,
    catalog: Arc<dyn Catalog>,
    columns: Vec<Column>,
    file_prefix: String,
    name: String,
}

impl CommitJob {
    /// Writes `messages` (in offset order) as one data file per day and commits them
    /// with the last offset; the rows are built off the async threads.
    async fn run(self, messages: Vec<StoredMessage>) -> Result<iceberg::table::Table, TableError> {
        let Some(last) = messages.last().map(|m| m.offset) else {
            return Ok(self.table);
        };
        let table = &self.table;
        let metadata = table.metadata();
        let schema = metadata.current_schema().clone();
        let arrow_schema = Arc::new(iceberg::arrow::schema_to_arrow_schema(&schema)?);
        let spec = metadata.default_partition_spec().as_ref().clone();
        let rows = messages.len();
        let columns = self.columns.clone();
        let days = tokio::task::spawn_blocking(move || {
            let mut by_day: BTreeMap<i32, Vec<&StoredMessage>> = BTreeMap::new();
            for message in &messages {
                by_day.entry(day_of(message)).or_default().push(message);
            }
            by_day
                .into_iter()
                .map(|(day, rows)| Ok((day, batch(&columns, &arrow_schema, &rows)?)))
                .collect::<Result<Vec<_>, TableError>>()
        })
        .await
        .map_err(|e| TableError::Setup(format!("building rows: {e}")))??;
        let mut files = Vec::new();
        for (day, rows) in days {
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
            writer.write(rows).await?;
            files.extend(writer.close().await?);
        }
        // The crate's transaction appends to whatever the catalog holds now, so a
        // writer that missed a commit of its own (which seemed to fail) would repeat
        // its rows: the table must still end where this commit begins.
        let current = self.catalog.load_table(table.identifier()).await?;
        if committed_of(&current) != self.base {
            return Err(TableError::Setup(format!(
                "table {} holds up to offset {}, not {}: reading it again",
                self.name,
                committed_of(&current),
                self.base
            )));
        }
        let tx = Transaction::new(&current);
        let tx = tx
            .fast_append()
            .add_data_files(files)
            .set_snapshot_properties(HashMap::from([(
                COMMITTED_OFFSET.to_owned(),
                last.to_string(),
            )]))
            .apply(tx)?;
        let table = tx.commit(&*self.catalog).await?;
        tracing::debug!(table = %self.name, rows, last, "table commit");
        Ok(table)
    }
}

#[cfg(test)]
mod tests;
