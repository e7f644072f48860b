//! `canopy bench`: runs the `canopy-bench` executable (the `bench/` crate) with the same
//! arguments, so the server binary carries no load generator and no WebSocket client
//! while the command stays where people look for it. `canopy bench --help` is
//! `canopy-bench --help`: the flags have one source of truth.
//!
//! Must never: interpret the arguments (they all belong to `canopy-bench`), or run
//! anything but a file named `canopy-bench`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, anyhow};
use clap::Args;

/// The executable's name without the platform's suffix.
const EXECUTABLE: &str = "canopy-bench";

#[derive(Args)]
pub struct BenchLaunch {
    /// The flags of the run, passed to `canopy-bench` unchanged (`canopy bench --help`
    /// lists them).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        num_args = 0..,
        value_name = "FLAGS"
    )]
    args: Vec<OsString>,
}

/// Runs `canopy-bench` with `launch`'s arguments, this process's standard streams and
/// environment, and returns its exit status (on Unix the process becomes
/// `canopy-bench`, so signals and the status need no passing on).
pub fn launch(launch: &BenchLaunch) -> Result<ExitCode> {
    let program = locate()?;
    let mut command = std::process::Command::new(&program);
    command.args(&launch.args);
    run(command, &program)
}

#[cfg(unix)]
fn run(mut command: std::process::Command, program: &Path) -> Result<ExitCode> {
    use std::os::unix::process::CommandExt as _;
    // `exec` returns only when it failed.
    let error = command.exec();
    Err(error).with_context(|| format!("cannot run {}", program.display()))
}

#[cfg(not(unix))]
fn run(mut command: std::process::Command, program: &Path) -> Result<ExitCode> {
    let status = command
        .status()
        .with_context(|| format!("cannot run {}", program.display()))?;
    Ok(status
        .code()
        .and_then(|code| u8::try_from(code).ok())
        .map_or(ExitCode::FAILURE, ExitCode::from))
}

/// `canopy-bench` beside this executable (where cargo builds and installs both), else
/// the first on PATH.
fn locate() -> Result<PathBuf> {
    let name = format!("{EXECUTABLE}{}", std::env::consts::EXE_SUFFIX);
    let dir = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf));
    if let Some(beside) = dir.as_ref().map(|dir| dir.join(&name))
        && runnable(&beside)
    {
        return Ok(beside);
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(&name))
            .find(|candidate| runnable(candidate))
    });
    on_path.ok_or_else(|| {
        let beside = dir.map_or_else(
            || "beside this one".to_owned(),
            |dir| format!("beside this one (in {})", dir.display()),
        );
        anyhow!(
            "`canopy bench` runs the {EXECUTABLE} executable, which is neither {beside} nor \
             on PATH: build it with `cargo build --release -p canopy-bench` (it lands beside \
             target/release/canopy; a plain `cargo build --release` at the repository's root \
             builds both), or install it with `cargo install --path bench`"
        )
    })
}

fn runnable(path: &Path) -> bool {
    let Ok(metadata) = path.metadata() else {
        return false;
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        metadata.is_file() && metadata.permissions().mode() & 0o111 != 0
    }
    #[cfg(not(unix))]
    {
        metadata.is_file()
    }
}
