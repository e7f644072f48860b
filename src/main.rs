//! The `canopy` command line: the server (`serve`) and the tools people use against
//! it (`pub`, `sub`, `tenant`, `user`, `group`, `bench`, `config`; logins and TLS through the
//! connection flags of `cli::connect`). Errors end here as one readable message and a
//! non-zero exit status, never a panic.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use canopy::client::Client;
use canopy::config::{Config, DEFAULT_TOML};
use clap::{Args, Parser, Subcommand};
use cli::connect::ConnectArgs;

use cli::pubsub::{publish, subscribe};
use cli::serve::serve;

mod cli;

// glibc's malloc took about a fifth of the server's CPU under storing load: its arena
// locks, contended between the runtime's workers and the engine's threads, and its
// consolidation on free. jemalloc's per-thread caches remove both (fan-in over 10,000
// stored subjects: 9.5 -> 7.3 µs of server CPU per message; BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read once at its start (the `_rjem_` prefix is the crate's
/// symbol prefix). Freed pages go back to the system after about a second, from a
/// background thread, so RSS follows the load down instead of holding its peak for the
/// default ten seconds; `MALLOC_CONF`-style overrides still come from `_RJEM_MALLOC_CONF`.
#[unsafe(export_name = "_rjem_malloc_conf")]
static JEMALLOC_OPTIONS: JemallocOptions =
    JemallocOptions(c"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0".as_ptr());

/// The `const char *` jemalloc reads its options through.
#[repr(transparent)]
struct JemallocOptions(*const std::ffi::c_char);

// SAFETY: it points at a static string that nothing ever writes.
unsafe impl Sync for JemallocOptions {}

#[derive(Parser)]
#[command(
    name = "canopy",
    version,
    about = "Pub/sub for devices, browsers and services, with a durable stream per subject",
    long_about = "Canopy is a pub/sub server. Services connect with any NATS client library, \
                  people with this command.\n\nStart a server with `canopy serve`, then try \
                  `canopy sub 'devices.*.temp'` in one terminal and \
                  `canopy pub devices.42.temp 21.5` in another."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server (no config file or setup needed).
    Serve(ServeArgs),
    /// Publish a message, or one message per line of standard input.
    Pub(PubArgs),
    /// Print the messages published to subjects matching a pattern.
    Sub(SubArgs),
    /// Print one stored message of a subject (the latest, or a version).
    Get(GetArgs),
    /// Print the stored history of a subject or pattern, and optionally follow it.
    Replay(ReplayArgs),
    /// List stored subjects matching a pattern, with their versions.
    Subjects(SubjectsArgs),
    /// Store or read a subject's snapshot (its state as of a version).
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// Delete the stored history of a subject or pattern (asks first).
    Purge(PurgeArgs),
    /// Create, list, describe, update or delete tenants.
    #[command(subcommand)]
    Tenant(TenantCommand),
    /// Create, list and delete a tenant's users; issue and revoke their tokens.
    #[command(subcommand)]
    User(cli::users::UserCommand),
    /// Create, list, show and delete consumer groups (each subject to one member at a
    /// time, in order).
    #[command(subcommand)]
    Group(cli::groups::GroupCommand),
    /// Bind JSON Schemas to subject patterns; show, list and delete them, their
    /// history and the messages they refused.
    #[command(subcommand)]
    Schema(cli::schemas::SchemaCommand),
    /// Bind WebAssembly plugins to subject patterns (filters and transforms on
    /// publish); show, list and delete them.
    #[command(subcommand)]
    Plugin(cli::plugins::PluginCommand),
    /// Keep subject patterns encrypted at rest (envelope encryption): seal, rotate,
    /// stop, shred and list data keys.
    #[command(subcommand)]
    Encryption(cli::encryption::EncryptionCommand),
    /// Print the tenant's AsyncAPI 3.0 document: a channel per bound pattern, its
    /// schema as the message payload, the operations your rules allow.
    Asyncapi(cli::schemas::AsyncApiArgs),
    /// Measure live pub/sub throughput and latency of any NATS-protocol server.
    #[command(
        long_about = "Measure live pub/sub throughput and latency of any NATS-protocol \
                      server, MQTT server or WebSocket API.\n\nRuns the canopy-bench \
                      executable (beside this one, or on PATH) with these arguments: \
                      `canopy bench --help` shows its flags and shapes.",
        disable_help_flag = true
    )]
    Bench(cli::bench::BenchLaunch),
    /// Show a cluster of nodes: who is alive, and who owns which shard.
    #[command(subcommand)]
    Cluster(cli::cluster::ClusterCommand),
    /// Show or check configuration.
    #[command(subcommand)]
    Config(ConfigCommand),
}

#[derive(Args)]
struct ServeArgs {
    /// TOML configuration file (see `canopy config default`).
    #[arg(short, long, env = "CANOPY_CONFIG")]
    config: Option<PathBuf>,
    /// Address of the NATS-compatible listener, e.g. 127.0.0.1:4222 (port 0: any free port).
    #[arg(long, value_name = "ADDR")]
    listen: Option<std::net::SocketAddr>,
    /// Address of the MQTT listener, e.g. 127.0.0.1:1883 (port 0: any free port).
    #[arg(long, value_name = "ADDR")]
    mqtt_listen: Option<std::net::SocketAddr>,
    /// Address of the HTTP listener (health, metrics), e.g. 127.0.0.1:8080.
    #[arg(long, value_name = "ADDR")]
    http_listen: Option<std::net::SocketAddr>,
    /// Accept anonymous clients on non-loopback addresses.
    #[arg(long)]
    allow_anonymous: bool,
    /// Log filter, e.g. `info`, `debug` or `canopy=debug` (overrides RUST_LOG).
    #[arg(long, value_name = "FILTER")]
    log: Option<String>,
}

#[derive(Args)]
struct PubArgs {
    /// Subject to publish to, e.g. devices.42.temp.
    subject: String,
    /// The payload. Without it, every line of standard input is published as a message.
    data: Option<String>,
    /// A header `Name: value` (repeatable).
    #[arg(short = 'H', long = "header", value_name = "NAME: VALUE")]
    headers: Vec<String>,
    /// Store only if the subject is at exactly this version (0: it must not exist yet).
    #[arg(long, value_name = "VERSION")]
    expect: Option<u64>,
    /// Store once: a repeat with the same id within the dedupe window is not stored again.
    #[arg(long, value_name = "ID")]
    msg_id: Option<String>,
    /// Wait for the store's durable ack and print it (implied by --expect and --msg-id).
    #[arg(long)]
    ack: bool,
    /// Wait until these consumer groups (comma-separated) have acked the message too.
    #[arg(long = "await", value_name = "GROUPS")]
    await_groups: Option<String>,
    /// How long --await waits: milliseconds, or with `ms` or `s` (default 5s, at most 60s).
    #[arg(long, value_name = "DURATION", requires = "await_groups")]
    await_timeout: Option<String>,
    /// Print the ack as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    connect: ConnectArgs,
}

#[derive(Args)]
struct GetArgs {
    /// The subject, e.g. devices.42.temp.
    subject: String,
    /// A version; the latest without it.
    #[arg(short, long)]
    version: Option<u64>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    connect: ConnectArgs,
}

#[derive(Args)]
struct ReplayArgs {
    /// A subject, or a pattern (then in global offset order), e.g. 'devices.*.temp'.
    target: String,
    /// Where to start: `start`, `snapshot` (the newest snapshot, then what follows), a
    /// version (an offset for patterns), or an age (30s, 5m, 2h, 1d).
    #[arg(long, default_value = "start", value_name = "WHERE")]
    from: cli::streams::StartAt,
    /// After the history, keep printing new messages as they are stored.
    #[arg(short, long)]
    follow: bool,
    /// Exit after this many messages.
    #[arg(short = 'n', long, value_name = "N")]
    count: Option<u64>,
    /// Print one JSON object per message.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    connect: ConnectArgs,
}

#[derive(Subcommand)]
enum SnapshotCommand {
    /// Store DATA as the state of SUBJECT as of VERSION.
    Put {
        subject: String,
        version: u64,
        data: String,
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// Print the newest snapshot of SUBJECT (or the newest at or below --version).
    Get {
        subject: String,
        #[arg(short, long)]
        version: Option<u64>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        connect: ConnectArgs,
    },
}

#[derive(Subcommand)]
enum TenantCommand {
    /// Create tenant NAME (one store write; its data needs no setup).
    Create {
        name: String,
        #[command(flatten)]
        limits: cli::tenants::LimitArgs,
        #[command(flatten)]
        anonymous: cli::tenants::AnonymousArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// List the tenants and their limits.
    List {
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// Show a tenant's limits, anonymous rules and usage.
    Describe {
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// Replace a tenant's limits (limits not given are removed) and, when an
    /// --anonymous-* flag or --no-anonymous is given, its anonymous rules (kept
    /// otherwise).
    Update {
        name: String,
        #[command(flatten)]
        limits: cli::tenants::LimitArgs,
        #[command(flatten)]
        anonymous: cli::tenants::AnonymousArgs,
        /// End anonymous access: clients must log in.
        #[arg(long, conflicts_with_all = ["anonymous_publish", "anonymous_subscribe"])]
        no_anonymous: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// Delete a tenant: it is gone at once and its data is purged in the background.
    Delete {
        name: String,
        #[command(flatten)]
        connect: ConnectArgs,
    },
}

#[derive(Args)]
struct PurgeArgs {
    /// A subject, or a pattern such as 'devices.42.>'.
    target: String,
    /// Do not ask for confirmation.
    #[arg(long)]
    yes: bool,
    #[command(flatten)]
    connect: ConnectArgs,
}

#[derive(Args)]
struct SubjectsArgs {
    /// Which subjects, e.g. 'devices.>' (all when left out).
    #[arg(default_value = ">")]
    pattern: String,
    /// Print one JSON object per subject.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    connect: ConnectArgs,
}

#[derive(Args)]
struct SubArgs {
    /// Pattern to follow: `*` matches one token, `>` the rest, e.g. 'devices.*.temp'.
    pattern: String,
    /// Print one JSON object per message.
    #[arg(long)]
    json: bool,
    /// Exit after this many messages.
    #[arg(short = 'n', long, value_name = "N")]
    count: Option<u64>,
    /// Join a queue group: each message goes to one member of the group.
    #[arg(short, long, value_name = "GROUP", conflicts_with = "from")]
    queue: Option<String>,
    /// Start from stored history, then follow: `start`, a version (an offset for
    /// patterns), or an age (30s, 5m, 2h, 1d).
    #[arg(long, value_name = "WHERE")]
    from: Option<cli::streams::StartAt>,
    #[command(flatten)]
    connect: ConnectArgs,
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Print the default configuration, with every field explained.
    Default,
    /// Check a configuration file (and CANOPY_* variables) and print the result.
    Check {
        /// The file to check; without it, the defaults plus environment.
        file: Option<PathBuf>,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Config(command) => {
            config_command(command).map(|()| std::process::ExitCode::SUCCESS)
        }
        // Another executable's status, so no runtime here.
        Command::Bench(launch) => cli::bench::launch(&launch),
        command => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("cannot start the async runtime")
            .and_then(|runtime| runtime.block_on(run(command)))
            .map(|()| std::process::ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("canopy: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(command: Command) -> Result<()> {
    match command {
        Command::Serve(args) => serve(args).await,
        Command::Pub(args) => publish(args).await,
        Command::Sub(args) => subscribe(args).await,
        Command::Get(args) => {
            let (mut client, timeout) = connect(&args.connect, "canopy get").await?;
            cli::streams::show_one(
                &mut client,
                "$CANOPY.get",
                &args.subject,
                args.version,
                args.json,
                timeout,
            )
            .await
        }
        Command::Replay(args) => {
            let (mut client, timeout) = connect(&args.connect, "canopy replay").await?;
            cli::streams::replay(
                &mut client,
                &args.target,
                args.from,
                args.follow,
                args.count,
                args.json,
                timeout,
            )
            .await
        }
        Command::Snapshot(SnapshotCommand::Put {
            subject,
            version,
            data,
            connect: how,
        }) => {
            let (mut client, timeout) = connect(&how, "canopy snapshot").await?;
            cli::streams::snapshot_put(&mut client, &subject, version, &data, timeout).await
        }
        Command::Snapshot(SnapshotCommand::Get {
            subject,
            version,
            json,
            connect: how,
        }) => {
            let (mut client, timeout) = connect(&how, "canopy snapshot").await?;
            cli::streams::show_one(
                &mut client,
                "$CANOPY.snapshot.get",
                &subject,
                version,
                json,
                timeout,
            )
            .await
        }
        Command::Tenant(command) => run_tenant(command).await,
        Command::Cluster(command) => cli::cluster::run(command).await,
        Command::User(command) => cli::users::run(command).await,
        Command::Group(command) => cli::groups::run(command).await,
        Command::Schema(command) => cli::schemas::run(command).await,
        Command::Plugin(command) => cli::plugins::run(command).await,
        Command::Encryption(command) => cli::encryption::run(command).await,
        Command::Asyncapi(args) => cli::schemas::asyncapi(args).await,
        Command::Purge(args) => {
            let (mut client, timeout) = connect(&args.connect, "canopy purge").await?;
            cli::streams::purge(&mut client, &args.target, args.yes, timeout).await
        }
        Command::Subjects(args) => {
            let (mut client, timeout) = connect(&args.connect, "canopy subjects").await?;
            cli::streams::subjects(&mut client, &args.pattern, args.json, timeout).await
        }
        Command::Bench(_) | Command::Config(_) => Ok(()),
    }
}

fn config_command(command: ConfigCommand) -> Result<()> {
    match command {
        ConfigCommand::Default => {
            print!("{DEFAULT_TOML}");
            Ok(())
        }
        ConfigCommand::Check { file } => {
            let config = Config::load(file.as_deref(), std::env::vars())?;
            print!("{}", config.to_toml());
            Ok(())
        }
    }
}

async fn connect(args: &ConnectArgs, name: &str) -> Result<(Client, Duration)> {
    args.connect(name).await
}

async fn run_tenant(command: TenantCommand) -> anyhow::Result<()> {
    use cli::tenants;
    match command {
        TenantCommand::Create {
            name,
            limits,
            anonymous,
            json,
            connect: how,
        } => {
            let anonymous = anonymous.json(false);
            let (mut client, timeout) = connect(&how, "canopy tenant").await?;
            let change = tenants::Change::Create;
            tenants::change(
                &mut client,
                change,
                &name,
                &limits,
                anonymous,
                json,
                timeout,
            )
            .await
        }
        TenantCommand::Update {
            name,
            limits,
            anonymous,
            no_anonymous,
            json,
            connect: how,
        } => {
            let anonymous = anonymous.json(no_anonymous);
            let (mut client, timeout) = connect(&how, "canopy tenant").await?;
            let change = tenants::Change::Update;
            tenants::change(
                &mut client,
                change,
                &name,
                &limits,
                anonymous,
                json,
                timeout,
            )
            .await
        }
        TenantCommand::List { json, connect: how } => {
            let (mut client, timeout) = connect(&how, "canopy tenant").await?;
            tenants::list(&mut client, json, timeout).await
        }
        TenantCommand::Describe {
            name,
            json,
            connect: how,
        } => {
            let (mut client, timeout) = connect(&how, "canopy tenant").await?;
            tenants::describe(&mut client, &name, json, timeout).await
        }
        TenantCommand::Delete { name, connect: how } => {
            let (mut client, timeout) = connect(&how, "canopy tenant").await?;
            tenants::delete(&mut client, &name, timeout).await
        }
    }
}
