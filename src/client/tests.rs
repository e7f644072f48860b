use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::ServerName;
use rustls_pki_types::pem::PemObject;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

use super::{Client, ClientError, ClientOptions, TlsFiles, server_name};

const WAIT: Duration = Duration::from_secs(5);

#[test]
fn the_server_name_is_the_url_host() {
    let name = |url| server_name(url).map(|n| n.to_str().into_owned());
    assert_eq!(
        name("nats://localhost:4222").ok().as_deref(),
        Some("localhost")
    );
    assert!(matches!(
        server_name("nats://127.0.0.1:4222"),
        Ok(ServerName::IpAddress(_))
    ));
    assert!(matches!(
        server_name("tls://[::1]:4222"),
        Ok(ServerName::IpAddress(_))
    ));
    assert_eq!(
        name("canopy.example.com").ok().as_deref(),
        Some("canopy.example.com")
    );
    assert!(matches!(
        server_name("nats://not a host:1"),
        Err(ClientError::ServerName { .. })
    ));
}

#[test]
fn tls_files_must_make_sense_together() {
    let files = |ca: Option<&str>, cert: Option<&str>, key: Option<&str>| TlsFiles {
        ca: ca.map(Into::into),
        cert: cert.map(Into::into),
        key: key.map(Into::into),
    };
    assert!(matches!(files(None, None, None).client_config(), Ok(None)));
    let alone = files(Some("ca.pem"), Some("c.pem"), None).client_config();
    assert!(matches!(alone, Err(ClientError::TlsSettings(_))));
    let no_ca = files(None, Some("c.pem"), Some("c.key")).client_config();
    assert!(matches!(no_ca, Err(ClientError::TlsSettings(ref m)) if m.contains("--tls-ca")));
    let missing = files(Some("/nonexistent/ca.pem"), None, None).client_config();
    let Err(error) = missing else {
        panic!("a missing CA file was accepted");
    };
    assert!(error.to_string().contains("/nonexistent/ca.pem"), "{error}");
}

/// A server that sends `info`, then hands the connection to `then`.
async fn fake_server<F, Fut>(info: &str, then: F) -> String
where
    F: FnOnce(tokio::net::TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("nats://{}", listener.local_addr().expect("addr"));
    let info = format!("INFO {info}\r\n");
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.expect("accept");
        socket.write_all(info.as_bytes()).await.expect("INFO");
        then(socket).await;
    });
    url
}

/// Reads CONNECT (and the PING after it); answers `answer`; returns CONNECT.
async fn answer_connect<S>(stream: S, answer: &[u8]) -> String
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut lines = BufReader::new(stream);
    let mut connect = String::new();
    lines.read_line(&mut connect).await.expect("CONNECT");
    let mut ping = String::new();
    lines.read_line(&mut ping).await.expect("PING");
    assert_eq!(ping, "PING\r\n");
    lines.get_mut().write_all(answer).await.expect("answer");
    lines.get_mut().flush().await.expect("flush");
    connect
}

#[tokio::test]
async fn credentials_go_in_connect_and_a_refusal_says_why() {
    let (seen, connect_line) = tokio::sync::oneshot::channel();
    let url = fake_server(
        r#"{"auth_required":true,"max_payload":1024}"#,
        |socket| async {
            let connect = answer_connect(socket, b"-ERR 'Authorization Violation'\r\n").await;
            let _ = seen.send(connect);
        },
    )
    .await;
    let mut options = ClientOptions::new("test", WAIT);
    options.user = Some("dev-1@acme".into());
    options.password = Some("pw-1".into());
    let refused = Client::connect(&url, &options).await;
    let Err(error) = refused else {
        panic!("a refused login connected");
    };
    assert!(matches!(error, ClientError::LoginRefused { .. }), "{error}");
    assert!(
        error.to_string().contains("Authorization Violation"),
        "{error}"
    );
    let connect = connect_line.await.expect("CONNECT seen");
    assert!(connect.starts_with("CONNECT {"), "{connect}");
    assert!(connect.contains(r#""user":"dev-1@acme""#), "{connect}");
    assert!(connect.contains(r#""pass":"pw-1""#), "{connect}");
    assert!(!connect.contains("auth_token"), "{connect}");
}

#[tokio::test]
async fn tls_without_a_ca_is_refused_with_the_flag_to_pass() {
    let url = fake_server(
        r#"{"tls_required":true,"max_payload":1024}"#,
        |socket| async {
            // Hold the connection until the client gives up.
            let mut socket = socket;
            let _ = tokio::io::AsyncReadExt::read_u8(&mut socket).await;
        },
    )
    .await;
    let refused = Client::connect(&url, &ClientOptions::new("test", WAIT)).await;
    let Err(error) = refused else {
        panic!("connected in the clear to a TLS server");
    };
    assert!(matches!(error, ClientError::TlsCaMissing { .. }), "{error}");
    assert!(error.to_string().contains("--tls-ca"), "{error}");
}

/// A CA and a server certificate for 127.0.0.1, as PEM files.
fn test_pki(dir: &std::path::Path) -> Arc<rustls::ServerConfig> {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().expect("key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).expect("CA");
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().expect("key");
    let cert = CertificateParams::new(vec!["127.0.0.1".into()])
        .expect("params")
        .signed_by(&key, &issuer)
        .expect("certificate");
    std::fs::write(dir.join("ca.pem"), ca_cert.pem()).expect("write");
    let chain = vec![cert.der().clone()];
    let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes())
        .expect("key");
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("server config");
    Arc::new(config)
}

#[tokio::test]
async fn info_in_the_clear_then_connect_over_tls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let acceptor = tokio_rustls::TlsAcceptor::from(test_pki(dir.path()));
    let (seen, connect_line) = tokio::sync::oneshot::channel();
    let url = fake_server(
        r#"{"tls_required":true,"auth_required":true,"max_payload":1024}"#,
        move |socket| async move {
            let tls = acceptor.accept(socket).await.expect("handshake");
            let connect = answer_connect(tls, b"PONG\r\n").await;
            let _ = seen.send(connect);
        },
    )
    .await;
    let mut options = ClientOptions::new("test", WAIT);
    options.token = Some("cnp.acme.dev-1.id.secret".into());
    options.tls.ca = Some(dir.path().join("ca.pem"));
    let client = Client::connect(&url, &options).await.expect("connected");
    assert!(client.server_info().tls_required);
    let connect = connect_line.await.expect("CONNECT over TLS");
    assert!(
        connect.contains(r#""auth_token":"cnp.acme.dev-1.id.secret""#),
        "{connect}"
    );
    assert!(connect.contains(r#""tls_required":true"#), "{connect}");

    // The same CA against a server without TLS: refused, not sent in the clear.
    let clear = fake_server(r#"{"max_payload":1024}"#, |_| async {}).await;
    let refused = Client::connect(&clear, &options).await;
    assert!(matches!(refused, Err(ClientError::TlsUnavailable { .. })));
}
