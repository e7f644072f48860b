//! The `canopy` binary against a server that requires logins and TLS: credentials
//! and TLS files from flags and `CANOPY_*` variables, `canopy user`, tokens, client
//! certificates, refusals that say why, and a tenant's anonymous rules.

use std::process::{Output, Stdio};

use canopy::server::RunningServer;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

use crate::common::{WAIT, start, test_config};

const BIN: &str = env!("CARGO_BIN_EXE_canopy");

/// Variables a developer's shell may set that would change what the commands do.
const ENV: [&str; 7] = [
    "CANOPY_SERVER",
    "CANOPY_USER",
    "CANOPY_PASSWORD",
    "CANOPY_TOKEN",
    "CANOPY_TLS_CA",
    "CANOPY_TLS_CERT",
    "CANOPY_TLS_KEY",
];

use crate::tls::TestPki;

/// A server with logins, a bootstrap admin (`admin` / `admin-pw`) and TLS with
/// client certificates; and the `canopy` commands that talk to it.
struct Setup {
    server: RunningServer,
    pki: TestPki,
    url: String,
}

impl Setup {
    async fn start() -> Setup {
        let pki = TestPki::new();
        let mut config = test_config();
        config.authz.require_login = true;
        config.authz.bootstrap_admin_password = Some("admin-pw".into());
        config.tls.cert_file = Some(pki.path("server.pem"));
        config.tls.key_file = Some(pki.path("server.key"));
        config.tls.client_ca_file = Some(pki.path("ca.pem"));
        let server = start(config).await;
        let url = format!("nats://127.0.0.1:{}", server.native_addr.port());
        Setup { server, pki, url }
    }

    /// `canopy ARGS --server URL`, with nothing from the environment.
    fn command(&self, args: &[&str], env: &[(&str, String)]) -> Command {
        let mut command = Command::new(BIN);
        for name in ENV {
            command.env_remove(name);
        }
        command
            .args(args)
            .args(["--server", &self.url])
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .kill_on_drop(true);
        command
    }

    /// The CA by its variable, as a shell would set it.
    fn ca_env(&self) -> Vec<(&'static str, String)> {
        vec![("CANOPY_TLS_CA", self.pki.file("ca.pem"))]
    }

    /// The admin's login and the CA, by variables.
    fn admin_env(&self) -> Vec<(&'static str, String)> {
        let mut env = self.ca_env();
        env.push(("CANOPY_USER", "admin".into()));
        env.push(("CANOPY_PASSWORD", "admin-pw".into()));
        env
    }

    async fn run(&self, args: &[&str], env: &[(&str, String)]) -> Output {
        tokio::time::timeout(WAIT, self.command(args, env).output())
            .await
            .expect("command finishes")
            .expect("command runs")
    }

    /// Runs a command as the admin; it must succeed. Its standard output.
    async fn admin(&self, args: &[&str]) -> String {
        let out = self.run(args, &self.admin_env()).await;
        succeeded(&out, args)
    }

    /// Starts `canopy sub` and waits until it is subscribed.
    async fn sub(&self, args: &[&str], env: &[(&str, String)]) -> Child {
        let mut child = self
            .command(args, env)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("sub starts");
        let mut stderr = BufReader::new(child.stderr.take().expect("stderr")).lines();
        let ready = tokio::time::timeout(WAIT, stderr.next_line())
            .await
            .expect("sub announces itself")
            .expect("read")
            .unwrap_or_default();
        assert!(ready.contains("subscribed to"), "{args:?}: {ready}");
        child
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The output of a command that must have succeeded.
fn succeeded(out: &Output, args: &[&str]) -> String {
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The error of a command that must have failed, cleanly.
fn failed(out: &Output, args: &[&str]) -> String {
    let stderr = text(&out.stderr);
    assert!(
        !out.status.success(),
        "{args:?} succeeded: {}",
        text(&out.stdout)
    );
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    stderr
}

async fn output_of(child: Child) -> String {
    let out = tokio::time::timeout(WAIT, child.wait_with_output())
        .await
        .expect("sub exits after --count")
        .expect("sub output");
    succeeded(&out, &["sub"])
}

#[tokio::test]
async fn logins_tokens_and_certificates_from_the_command_line() {
    let setup = Setup::start().await;
    assert_eq!(
        setup.admin(&["tenant", "create", "acme"]).await,
        "acme  no limits\n"
    );

    // A user with rules and a password read from standard input.
    let create = [
        "user",
        "create",
        "acme",
        "dev-1",
        "--password-stdin",
        "--allow-publish",
        "devices.{user}.>",
        "--allow-subscribe",
        "devices.{user}.>",
        "--allow-subscribe",
        "_INBOX.>",
    ];
    let mut child = setup
        .command(&create, &setup.admin_env())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("user create starts");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(b"pw-1\n").await.expect("password");
    drop(stdin);
    let out = tokio::time::timeout(WAIT, child.wait_with_output())
        .await
        .expect("user create finishes")
        .expect("output");
    assert_eq!(
        succeeded(&out, &create),
        "dev-1  password  publish allow devices.{user}.>; \
         subscribe allow devices.{user}.>, _INBOX.>\n"
    );

    // A token: alone on standard output, its id on standard error.
    let out = setup
        .run(&["user", "token", "acme", "dev-1"], &setup.admin_env())
        .await;
    let stdout = succeeded(&out, &["user", "token"]);
    let token = stdout.trim_end_matches('\n');
    assert!(
        token.starts_with("cnp.acme.dev-1.") && !token.contains(char::is_whitespace),
        "{stdout:?}"
    );
    let id = token.split('.').nth(3).expect("token id").to_owned();
    assert!(text(&out.stderr).contains(&id), "{}", text(&out.stderr));
    let listed = setup.admin(&["user", "list", "acme"]).await;
    assert!(
        listed.starts_with(&format!("dev-1  password, tokens {id}  publish allow")),
        "{listed}"
    );

    // The token, over TLS with the CA as a flag: subscribe and publish.
    let ca = setup.pki.file("ca.pem");
    let with_token = ["--tls-ca", ca.as_str(), "--token", token];
    let sub_args = [&["sub", "devices.dev-1.>", "-n", "3"][..], &with_token].concat();
    let sub = setup.sub(&sub_args, &[]).await;
    let args = [&["pub", "devices.dev-1.temp", "21.5"][..], &with_token].concat();
    succeeded(&setup.run(&args, &[]).await, &args);

    // A client certificate alone logs in the user its common name names, with that
    // user's rules, in that user's tenant.
    let (cert, key) = (setup.pki.file("client.pem"), setup.pki.file("client.key"));
    let with_cert = [
        "--tls-ca",
        ca.as_str(),
        "--tls-cert",
        cert.as_str(),
        "--tls-key",
        key.as_str(),
    ];
    let args = [
        &["pub", "devices.dev-1.cert", "by-certificate"][..],
        &with_cert,
    ]
    .concat();
    succeeded(&setup.run(&args, &[]).await, &args);
    let args = [&["pub", "devices.dev-2.cert", "not-mine"][..], &with_cert].concat();
    let error = failed(&setup.run(&args, &[]).await, &args);
    assert!(error.contains("Permissions Violation"), "{error}");

    // The user's own password, by flags.
    let args = [
        "pub",
        "devices.dev-1.pw",
        "by-password",
        "--tls-ca",
        ca.as_str(),
        "--user",
        "dev-1@acme",
        "--password",
        "pw-1",
    ];
    succeeded(&setup.run(&args, &[]).await, &args);
    assert_eq!(
        output_of(sub).await,
        "devices.dev-1.temp 21.5\ndevices.dev-1.cert by-certificate\n\
         devices.dev-1.pw by-password\n"
    );

    // The rules hold for the token too.
    let args = [&["pub", "devices.dev-2.temp", "x"][..], &with_token].concat();
    let error = failed(&setup.run(&args, &[]).await, &args);
    assert!(error.contains("Permissions Violation"), "{error}");

    // A wrong password: the server's reason, and a non-zero exit.
    let args = ["tenant", "list", "--user", "admin", "--password", "wrong"];
    let error = failed(&setup.run(&args, &setup.ca_env()).await, &args);
    assert!(
        error.contains("refused the login") && error.contains("Authorization Violation"),
        "{error}"
    );

    // No CA for a server that requires TLS: told which flag to pass.
    let args = [
        "tenant",
        "list",
        "--user",
        "admin",
        "--password",
        "admin-pw",
    ];
    let error = failed(&setup.run(&args, &[]).await, &args);
    assert!(
        error.contains("requires TLS") && error.contains("--tls-ca"),
        "{error}"
    );

    // A CA that did not sign the server's certificate: the handshake fails, clearly.
    let other = TestPki::new();
    let env = [("CANOPY_TLS_CA", other.file("ca.pem"))];
    let args = [
        "tenant",
        "list",
        "--user",
        "admin",
        "--password",
        "admin-pw",
    ];
    let error = failed(&setup.run(&args, &env).await, &args);
    assert!(
        error.contains("TLS handshake") && error.contains("--tls-ca"),
        "{error}"
    );

    // Revoked, the token no longer logs in; deleted, the user is gone.
    setup
        .admin(&["user", "revoke", "acme", "dev-1", id.as_str()])
        .await;
    let args = [&["pub", "devices.dev-1.temp", "x"][..], &with_token].concat();
    let error = failed(&setup.run(&args, &[]).await, &args);
    assert!(error.contains("Authorization Violation"), "{error}");
    let args = ["user", "revoke", "acme", "dev-1", id.as_str()];
    let error = failed(&setup.run(&args, &setup.admin_env()).await, &args);
    assert!(error.contains(&format!("has no token {id}")), "{error}");
    setup.admin(&["user", "delete", "acme", "dev-1"]).await;
    assert_eq!(setup.admin(&["user", "list", "acme"]).await, "");
    setup.server.stop().await;
}

#[tokio::test]
async fn anonymous_rules_from_the_command_line() {
    let setup = Setup::start().await;
    let anonymous = setup.ca_env();

    // No credentials and no anonymous rules: refused, with what to do.
    let args = ["sub", "public.>", "-n", "1"];
    let error = failed(&setup.run(&args, &anonymous).await, &args);
    assert!(
        error.contains("Authorization Violation") && error.contains("--user"),
        "{error}"
    );

    let updated = setup
        .admin(&[
            "tenant",
            "update",
            "default",
            "--anonymous-subscribe",
            "public.>",
        ])
        .await;
    assert_eq!(
        updated,
        "default  no limits  anonymous: publish deny >; subscribe allow public.>\n"
    );

    // Clients without credentials read the pattern, and nothing else, and publish
    // nowhere.
    let sub = setup.sub(&["sub", "public.>", "-n", "1"], &anonymous).await;
    setup.admin(&["pub", "public.news", "hello"]).await;
    assert_eq!(output_of(sub).await, "public.news hello\n");
    let args = ["pub", "public.news", "mine"];
    let error = failed(&setup.run(&args, &anonymous).await, &args);
    assert!(error.contains("Permissions Violation"), "{error}");
    let args = ["sub", "private.>", "-n", "1"];
    let error = failed(&setup.run(&args, &anonymous).await, &args);
    assert!(error.contains("Permissions Violation"), "{error}");

    // Describe shows the rules and the usage; an update without anonymous flags keeps
    // them, --no-anonymous ends them.
    let described = setup.admin(&["tenant", "describe", "default"]).await;
    assert!(
        described.starts_with("default  no limits  anonymous: publish deny >"),
        "{described}"
    );
    for field in [
        "connections",
        "subscriptions",
        "subjects",
        "stored_bytes",
        "msgs_per_sec",
        "bytes_per_sec",
        "refused_by_quota",
        "throttled_by_quota",
    ] {
        assert!(
            described
                .lines()
                .any(|l| l.starts_with(&format!("{field}  "))),
            "{field} missing: {described}"
        );
    }
    let kept = setup
        .admin(&["tenant", "update", "default", "--max-connections", "100"])
        .await;
    assert!(kept.contains("anonymous: publish deny >"), "{kept}");
    let ended = setup
        .admin(&["tenant", "update", "default", "--no-anonymous"])
        .await;
    assert_eq!(ended, "default  no limits\n");
    let args = ["sub", "public.>", "-n", "1"];
    let error = failed(&setup.run(&args, &anonymous).await, &args);
    assert!(error.contains("Authorization Violation"), "{error}");
    setup.server.stop().await;
}
