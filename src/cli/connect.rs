//! The connection flags every client subcommand shares: where the server is, how
//! long to wait, who to log in as and which TLS files to use. Each flag has a
//! `CANOPY_*` variable, so a shell can set them once; secrets are never shown in
//! `--help`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, bail};
use canopy::client::{Client, ClientOptions, TlsFiles};
use clap::Args;

/// Where the server is and how to log in to it.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Connection")]
pub struct ConnectArgs {
    #[command(flatten)]
    pub address: ServerArgs,
    /// Log in as this user: `name@tenant`, or `name` in the default tenant (`@tenant`
    /// alone: that tenant's anonymous access).
    #[arg(long, env = "CANOPY_USER", value_name = "NAME")]
    pub user: Option<String>,
    /// The user's password.
    #[arg(
        long,
        env = "CANOPY_PASSWORD",
        hide_env_values = true,
        value_name = "PASSWORD"
    )]
    pub password: Option<String>,
    /// Log in with a token (from `canopy user token`) instead of a password.
    #[arg(
        long,
        env = "CANOPY_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,
    /// Use TLS, trusting the server's certificate if this CA (a PEM file) signed it.
    /// Needed whenever the server requires TLS.
    #[arg(long, env = "CANOPY_TLS_CA", value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// A client certificate (PEM) to present; its common name logs in the user it
    /// names when no password or token is given. Needs --tls-key.
    #[arg(long, env = "CANOPY_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "CANOPY_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
}

impl ConnectArgs {
    /// The client's options; refuses combinations the server could only refuse later.
    pub fn options(&self, name: &str) -> Result<ClientOptions> {
        // An empty variable (`CANOPY_TOKEN=`) is as good as none.
        fn given(value: &Option<String>) -> Option<&str> {
            value.as_deref().filter(|v| !v.is_empty())
        }
        let (user, password, token) =
            (given(&self.user), given(&self.password), given(&self.token));
        if token.is_some() && (user.is_some() || password.is_some()) {
            bail!(
                "give either --token or --user and --password, not both (check CANOPY_TOKEN, \
                 CANOPY_USER and CANOPY_PASSWORD too)"
            );
        }
        if password.is_some() && user.is_none() {
            bail!("--password needs --user NAME (name@tenant, or name in the default tenant)");
        }
        if user.is_some_and(|u| !u.starts_with('@'))
            && password.is_none()
            && self.tls_cert.is_none()
        {
            bail!(
                "--user needs --password (or CANOPY_PASSWORD); `--user @TENANT` alone asks for \
                 a tenant's anonymous access"
            );
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            bail!("--tls-cert and --tls-key go together: give both or neither");
        }
        let mut options =
            ClientOptions::new(name, Duration::from_secs(self.address.timeout.max(1)));
        options.user = user.map(str::to_owned);
        options.password = password.map(str::to_owned);
        options.token = token.map(str::to_owned);
        options.tls = TlsFiles {
            ca: self.tls_ca.clone(),
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
        };
        Ok(options)
    }

    /// Connects and logs in; the client and the timeout to use for requests.
    pub async fn connect(&self, name: &str) -> Result<(Client, Duration)> {
        let options = self.options(name)?;
        let client = Client::connect(&self.address.server, &options).await?;
        Ok((client, options.timeout))
    }
}

/// Where a command connects: the address part of [`ConnectArgs`] (`canopy-bench` has its
/// own copy, since its clients take no credentials).
#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// Server to talk to.
    #[arg(
        short,
        long,
        env = "CANOPY_SERVER",
        default_value = "nats://127.0.0.1:4222",
        value_name = "URL"
    )]
    pub server: String,
    /// Seconds to wait for the server.
    #[arg(long, default_value_t = 5, value_name = "SECS")]
    pub timeout: u64,
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::ConnectArgs;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        connect: ConnectArgs,
    }

    fn options(args: &[&str]) -> anyhow::Result<canopy::client::ClientOptions> {
        let cli = Cli::try_parse_from(std::iter::once("canopy").chain(args.iter().copied()))?;
        cli.connect.options("test")
    }

    #[test]
    fn credentials_that_cannot_log_in_are_refused_before_connecting() {
        let both = options(&["--token", "cnp.a.b.c.d", "--user", "x", "--password", "y"]);
        assert!(both.is_err());
        assert!(options(&["--password", "y"]).is_err());
        assert!(options(&["--user", "admin"]).is_err());
        assert!(options(&["--tls-cert", "c.pem"]).is_err());
        let anonymous = options(&["--user", "@acme"]).expect("anonymous in a tenant");
        assert_eq!(anonymous.user.as_deref(), Some("@acme"));
        let login = options(&["--user", "admin", "--password", "pw"]).expect("a login");
        assert_eq!(login.password.as_deref(), Some("pw"));
        let certified = options(&["--tls-ca", "ca.pem", "--tls-cert", "c", "--tls-key", "k"])
            .expect("a certificate");
        assert!(certified.tls.cert.is_some() && certified.user.is_none());
    }
}
