//! `[[tables]]`: key streams written out as Iceberg tables. What each field means;
//! the writer is `crate::tables`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// One table: the stored subjects of a pattern, as rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableConfig {
    /// The subjects it holds (NATS syntax), e.g. `devices.*.temp`.
    pub pattern: String,
    /// `namespace.name` in the catalog, e.g. `iot.devices_temp`.
    pub table: String,
    /// The tenant whose subjects it holds.
    #[serde(default = "default_tenant")]
    pub tenant: String,
    /// A column name for each wildcard of the pattern, in order (default `token<N>`,
    /// N the token's place in the subject; `rest` for `>`).
    #[serde(default)]
    pub columns: Vec<String>,
    /// Commit at least this often while messages come.
    #[serde(default = "default_commit_secs")]
    pub commit_secs: u64,
    /// Commit once this many MiB of payload are waiting, whatever the time.
    #[serde(default = "default_commit_mib")]
    pub commit_mib: u64,
    /// A local folder for the catalog (`catalog.db`) and the table files, instead of
    /// the store's place (`tables/` in a local store's folder, or under the prefix
    /// of a store on S3); needed when the store is in memory.
    #[serde(default)]
    pub folder: Option<PathBuf>,
}

fn default_tenant() -> String {
    crate::store::DEFAULT_TENANT.to_owned()
}

fn default_commit_secs() -> u64 {
    10
}

fn default_commit_mib() -> u64 {
    64
}

impl TableConfig {
    /// The namespace and the name of `table`.
    pub fn ident(&self) -> Option<(&str, &str)> {
        let (namespace, name) = self.table.split_once('.')?;
        let word = |s: &str| {
            !s.is_empty()
                && s.len() <= 128
                && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        };
        (word(namespace) && word(name)).then_some((namespace, name))
    }

    /// What is wrong with it, if anything.
    pub fn check(&self) -> Result<(), String> {
        let pattern = canopy_subjects::Pattern::parse_native(&self.pattern)
            .map_err(|e| format!("tables: pattern {:?}: {e}", self.pattern))?;
        if self.ident().is_none() {
            return Err(format!(
                "tables: table {:?} must be namespace.name, each of letters, digits and _",
                self.table
            ));
        }
        let wildcards = pattern.tokens().iter().filter(|t| t.is_wildcard()).count();
        if self.columns.len() > wildcards {
            return Err(format!(
                "tables: {} names {} columns for {} wildcards of {:?}",
                self.table,
                self.columns.len(),
                wildcards,
                self.pattern
            ));
        }
        if self.commit_secs == 0 || self.commit_mib == 0 {
            return Err(format!(
                "tables: {}: commit_secs and commit_mib must be above 0",
                self.table
            ));
        }
        Ok(())
    }
}
