//! An Iceberg catalog kept in the table's own bucket, for stores on S3, where the
//! server has no local folder for a SQLite catalog to live in.
//!
//! A table is the folder `<root>/<namespace>/<name>`; its versions are
//! `metadata/v<N>.metadata.json`, and a commit is the conditional creation of the
//! next one (S3's `If-None-Match: *`), so two writers can never both make version N
//! and a commit either happened or did not. `metadata/version-hint.text` holds the
//! last N, as the file-system (Hadoop) table layout does, so DuckDB's `iceberg_scan`
//! and pyiceberg's `StaticTable` open the folder as it is; the hint may lag and is
//! only where the search for the newest version starts. Must never overwrite a
//! version.

use std::collections::HashMap;

use async_trait::async_trait;
use bytes::Bytes;
use iceberg::spec::{TableMetadata, TableMetadataBuilder};
use iceberg::table::Table;
use iceberg::{
    Catalog, Error, ErrorKind, Namespace, NamespaceIdent, Result, TableCommit, TableCreation,
    TableIdent,
};

use super::object_io::ObjectIo;

/// Versions looked for past the hint before the newest is taken as found.
const HINT_LAG: u64 = 1_000;

#[derive(Debug)]
pub struct ObjectCatalog {
    io: ObjectIo,
    /// Where the namespaces' folders are (`s3://bucket/prefix/tables`).
    root: String,
}

impl ObjectCatalog {
    pub fn new(io: ObjectIo, root: &str) -> ObjectCatalog {
        ObjectCatalog {
            io,
            root: root.trim_end_matches('/').to_owned(),
        }
    }

    /// The table's folder.
    pub fn location(&self, table: &TableIdent) -> String {
        format!(
            "{}/{}/{}",
            self.root,
            table.namespace().join("/"),
            table.name()
        )
    }

    fn version_location(folder: &str, version: u64) -> String {
        format!("{folder}/metadata/v{version}.metadata.json")
    }

    fn hint_location(folder: &str) -> String {
        format!("{folder}/metadata/version-hint.text")
    }

    /// The newest version of the table and its metadata, `None` when it has none.
    async fn newest(&self, table: &TableIdent) -> Result<Option<(u64, TableMetadata)>> {
        let folder = self.location(table);
        let hint = match self.io.read_if_any(&Self::hint_location(&folder)).await? {
            Some(bytes) => std::str::from_utf8(&bytes)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok()),
            None => None,
        };
        let mut found = None;
        let start = match hint {
            Some(hint) => hint,
            // No hint (never written, or lost): list the versions there are.
            None => {
                let listed = self.io.list(&format!("{folder}/metadata")).await?;
                let newest = listed
                    .iter()
                    .filter_map(|l| l.rsplit('/').next())
                    .filter_map(|name| name.strip_prefix('v')?.strip_suffix(".metadata.json"))
                    .filter_map(|n| n.parse::<u64>().ok())
                    .max();
                match newest {
                    Some(newest) => newest,
                    None => return Ok(None),
                }
            }
        };
        // The hint is written after the version, so newer versions may follow it.
        for version in start..start.saturating_add(HINT_LAG) {
            match self
                .io
                .read_if_any(&Self::version_location(&folder, version))
                .await?
            {
                Some(bytes) => found = Some((version, bytes)),
                None if version > start || found.is_some() => break,
                None => {}
            }
        }
        let Some((version, bytes)) = found else {
            return Ok(None);
        };
        let metadata = serde_json::from_slice::<TableMetadata>(&bytes).map_err(|e| {
            Error::new(
                ErrorKind::DataInvalid,
                format!("{}: {e}", Self::version_location(&folder, version)),
            )
        })?;
        Ok(Some((version, metadata)))
    }

    fn table(&self, ident: &TableIdent, version: u64, metadata: TableMetadata) -> Result<Table> {
        Table::builder()
            .file_io(self.io.file_io())
            .metadata_location(Self::version_location(&self.location(ident), version))
            .metadata(metadata)
            .identifier(ident.clone())
            .runtime(iceberg::Runtime::try_current()?)
            .build()
    }

    /// Makes `version` of the table, or says it exists already.
    async fn write_version(
        &self,
        ident: &TableIdent,
        version: u64,
        metadata: &TableMetadata,
    ) -> Result<()> {
        let folder = self.location(ident);
        let bytes = serde_json::to_vec(metadata)
            .map_err(|e| Error::new(ErrorKind::DataInvalid, format!("table metadata: {e}")))?;
        if !self
            .io
            .create(
                &Self::version_location(&folder, version),
                Bytes::from(bytes),
            )
            .await?
        {
            return Err(Error::new(
                ErrorKind::CatalogCommitConflicts,
                format!("{ident}: version {version} was made by another writer"),
            ));
        }
        // Only a hint: a failure here leaves readers one search longer.
        let hint = Self::hint_location(&folder);
        if let Err(error) =
            iceberg::io::Storage::write(&self.io, &hint, Bytes::from(version.to_string())).await
        {
            tracing::warn!(%error, table = %ident, "cannot write the version hint");
        }
        Ok(())
    }
}

fn unsupported<T>(what: &str) -> Result<T> {
    Err(Error::new(
        ErrorKind::FeatureUnsupported,
        format!("the object-storage catalog does not {what}"),
    ))
}

#[async_trait]
impl Catalog for ObjectCatalog {
    async fn list_namespaces(
        &self,
        _parent: Option<&NamespaceIdent>,
    ) -> Result<Vec<NamespaceIdent>> {
        unsupported("list namespaces")
    }

    /// Namespaces are folders, made with their first table.
    async fn create_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> Result<Namespace> {
        Ok(Namespace::with_properties(namespace.clone(), properties))
    }

    async fn get_namespace(&self, namespace: &NamespaceIdent) -> Result<Namespace> {
        Ok(Namespace::new(namespace.clone()))
    }

    async fn namespace_exists(&self, _namespace: &NamespaceIdent) -> Result<bool> {
        Ok(true)
    }

    async fn update_namespace(
        &self,
        _namespace: &NamespaceIdent,
        _properties: HashMap<String, String>,
    ) -> Result<()> {
        unsupported("keep namespace properties")
    }

    async fn drop_namespace(&self, _namespace: &NamespaceIdent) -> Result<()> {
        unsupported("drop namespaces")
    }

    async fn list_tables(&self, _namespace: &NamespaceIdent) -> Result<Vec<TableIdent>> {
        unsupported("list tables")
    }

    async fn create_table(
        &self,
        namespace: &NamespaceIdent,
        creation: TableCreation,
    ) -> Result<Table> {
        let ident = TableIdent::new(namespace.clone(), creation.name.clone());
        if self.newest(&ident).await?.is_some() {
            return Err(Error::new(
                ErrorKind::TableAlreadyExists,
                format!("{ident} exists"),
            ));
        }
        let creation = TableCreation {
            location: Some(self.location(&ident)),
            ..creation
        };
        let metadata = TableMetadataBuilder::from_table_creation(creation)?
            .build()?
            .metadata;
        self.write_version(&ident, 1, &metadata).await?;
        self.table(&ident, 1, metadata)
    }

    async fn load_table(&self, ident: &TableIdent) -> Result<Table> {
        match self.newest(ident).await? {
            Some((version, metadata)) => self.table(ident, version, metadata),
            None => Err(Error::new(
                ErrorKind::TableNotFound,
                format!("{ident} does not exist"),
            )),
        }
    }

    async fn drop_table(&self, _table: &TableIdent) -> Result<()> {
        unsupported("drop tables")
    }

    async fn purge_table(&self, _table: &TableIdent) -> Result<()> {
        unsupported("purge tables")
    }

    async fn table_exists(&self, ident: &TableIdent) -> Result<bool> {
        Ok(self.newest(ident).await?.is_some())
    }

    async fn rename_table(&self, _src: &TableIdent, _dest: &TableIdent) -> Result<()> {
        unsupported("rename tables")
    }

    async fn register_table(
        &self,
        _table: &TableIdent,
        _metadata_location: String,
    ) -> Result<Table> {
        unsupported("register tables")
    }

    /// What `TableCommit::apply` does, but naming the new version `v<N+1>`, the
    /// conditional write of which is the commit.
    async fn update_table(&self, mut commit: TableCommit) -> Result<Table> {
        let ident = commit.identifier().clone();
        let Some((version, current)) = self.newest(&ident).await? else {
            return Err(Error::new(
                ErrorKind::TableNotFound,
                format!("{ident} does not exist"),
            ));
        };
        for requirement in commit.take_requirements() {
            requirement.check(Some(&current))?;
        }
        let mut builder = current.into_builder(Some(Self::version_location(
            &self.location(&ident),
            version,
        )));
        for update in commit.take_updates() {
            builder = update.apply(builder)?;
        }
        let metadata = builder.build()?.metadata;
        let next = version + 1;
        self.write_version(&ident, next, &metadata).await?;
        self.table(&ident, next, metadata)
    }
}
