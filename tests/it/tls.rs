//! TLS on every listener with real clients and a test CA made here (rcgen): async-nats
//! (`tls_required` upgrade after INFO, as NATS does), rumqttc over MQTT/TLS, and a
//! WebSocket client through tokio-rustls on the HTTP port; and client certificates
//! logging in the user their common name names.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::{SinkExt, StreamExt};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message as WsMessage;

use crate::common::{WAIT, api, start, test_config};

/// PEM files of a CA, a server certificate for localhost and 127.0.0.1, and a client
/// certificate whose common name is `dev-1@acme`.
pub struct TestPki {
    dir: tempfile::TempDir,
}

impl TestPki {
    pub fn new() -> TestPki {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca_key = KeyPair::generate().expect("key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "canopy test CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca.self_signed(&ca_key).expect("CA");
        let issuer = Issuer::new(ca, ca_key);

        let server_key = KeyPair::generate().expect("key");
        let mut server =
            CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()]).expect("params");
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server_cert = server.signed_by(&server_key, &issuer).expect("server");

        let client_key = KeyPair::generate().expect("key");
        let mut client = CertificateParams::new(Vec::<String>::new()).expect("params");
        client
            .distinguished_name
            .push(DnType::CommonName, "dev-1@acme");
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client_cert = client.signed_by(&client_key, &issuer).expect("client");

        let write = |name: &str, text: String| {
            std::fs::write(dir.path().join(name), text).expect("write PEM");
        };
        write("ca.pem", ca_cert.pem());
        write("server.pem", server_cert.pem());
        write("server.key", server_key.serialize_pem());
        write("client.pem", client_cert.pem());
        write("client.key", client_key.serialize_pem());
        TestPki { dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The path of `name`, as text for a command line.
    pub fn file(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }

    /// A rustls client trusting the test CA, with the client certificate if asked.
    fn client_config(&self, with_certificate: bool) -> rustls::ClientConfig {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(self.path("ca.pem")).expect("CA") {
            roots.add(cert.expect("CA cert")).expect("added");
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots);
        if with_certificate {
            let chain: Vec<_> = CertificateDer::pem_file_iter(self.path("client.pem"))
                .expect("cert")
                .map(|c| c.expect("cert"))
                .collect();
            let key = PrivateKeyDer::from_pem_file(self.path("client.key")).expect("key");
            builder
                .with_client_auth_cert(chain, key)
                .expect("client auth")
        } else {
            builder.with_no_client_auth()
        }
    }
}

/// async-nats and rumqttc build their own rustls configs with the process default
/// provider; this test binary links two, so one is named.
fn install_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

fn tls_config(pki: &TestPki) -> canopy::config::Config {
    let mut config = test_config();
    config.authz.require_login = true;
    config.authz.bootstrap_admin_password = Some("admin-pw".into());
    config.tls.cert_file = Some(pki.path("server.pem"));
    config.tls.key_file = Some(pki.path("server.key"));
    config.tls.client_ca_file = Some(pki.path("ca.pem"));
    config
}

async fn nats_tls(url: &str, pki: &TestPki) -> async_nats::ConnectOptions {
    let _ = url;
    async_nats::ConnectOptions::new()
        .add_root_certificates(pki.path("ca.pem"))
        .require_tls(true)
        .max_reconnects(Some(0))
}

type Wss =
    tokio_tungstenite::WebSocketStream<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;

/// `/ws` over TLS through tokio-rustls, with the client certificate and a token if
/// asked.
async fn wss(
    pki: &TestPki,
    http: std::net::SocketAddr,
    certificate: bool,
    token: Option<&str>,
) -> Wss {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(pki.client_config(certificate)));
    let tcp = tokio::net::TcpStream::connect(http).await.expect("tcp");
    let stream = connector
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
        .expect("TLS handshake");
    let mut request = tokio_tungstenite::tungstenite::ClientRequestBuilder::new(
        format!("wss://localhost:{}/ws", http.port())
            .parse()
            .expect("uri"),
    );
    if let Some(token) = token {
        request = request.with_header("Authorization", format!("Bearer {token}"));
    }
    let (socket, _) = tokio_tungstenite::client_async(request, stream)
        .await
        .expect("WebSocket over TLS");
    socket
}

/// Sends one `/ws` request and reads the next answer.
async fn ws_call(socket: &mut Wss, request: Value) -> Value {
    socket
        .send(WsMessage::text(request.to_string()))
        .await
        .expect("send");
    let reply = tokio::time::timeout(WAIT, socket.next())
        .await
        .expect("in time")
        .expect("open")
        .expect("frame");
    serde_json::from_str(&reply.into_text().expect("text")).expect("JSON")
}

#[tokio::test]
async fn every_listener_speaks_tls_and_client_certificates_log_users_in() {
    install_provider();
    let pki = TestPki::new();
    let server = start(tls_config(&pki)).await;
    let url = format!("nats://localhost:{}", server.native_addr.port());

    // Native: user and password over TLS, the admin setting up a tenant and user.
    let admin = nats_tls(&url, &pki)
        .await
        .user_and_password("admin".into(), "admin-pw".into())
        .connect(&url)
        .await
        .expect("the admin connects over TLS");
    let (status, body) = api(&admin, "tenant.create", json!({"name": "acme"})).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = api(
        &admin,
        "user.create",
        json!({"tenant": "acme", "name": "dev-1", "password": "pw-1",
               "permissions": {"publish": {"allow": ["devices.{user}.>"]},
                               "subscribe": {"allow": ["devices.{user}.>", "_INBOX.>"]}}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    // A client certificate alone logs dev-1 of acme in, with dev-1's ACL.
    let by_cert = nats_tls(&url, &pki)
        .await
        .add_client_certificate(pki.path("client.pem"), pki.path("client.key"))
        .connect(&url)
        .await
        .expect("the certificate logs in");
    let by_password = nats_tls(&url, &pki)
        .await
        .user_and_password("dev-1@acme".into(), "pw-1".into())
        .connect(&url)
        .await
        .expect("dev-1 logs in over TLS");
    let mut seen = by_password.subscribe("devices.dev-1.>").await.expect("sub");
    by_password.flush().await.expect("flush");
    by_cert
        .publish("devices.dev-1.temp", "21.5".into())
        .await
        .expect("pub");
    by_cert.flush().await.expect("flush");
    let got = tokio::time::timeout(WAIT, seen.next())
        .await
        .expect("in time")
        .expect("message");
    assert_eq!(&got.payload[..], b"21.5", "the same tenant, over TLS");

    // A client that will not speak TLS is not served.
    let clear =
        async_nats::ConnectOptions::with_user_and_password("admin".into(), "admin-pw".into())
            .max_reconnects(Some(0))
            .connection_timeout(std::time::Duration::from_secs(3))
            .connect(format!("127.0.0.1:{}", server.native_addr.port()))
            .await;
    assert!(clear.is_err(), "a clear-text client was served");

    // MQTT over TLS: rumqttc with the CA, by password, and by certificate alone.
    let mqtt = crate::mqtt::mqtt_addr(&server);
    let mut watch = by_password
        .subscribe("devices.dev-1.mqtt")
        .await
        .expect("sub");
    by_password.flush().await.expect("flush");
    for (client_id, certificate) in [("tls-pw", false), ("tls-cert", true)] {
        let mut options = rumqttc::MqttOptions::new(client_id, "localhost", mqtt.port());
        if !certificate {
            options.set_credentials("dev-1@acme", "pw-1");
        }
        options.set_transport(rumqttc::Transport::tls_with_config(
            rumqttc::TlsConfiguration::Rustls(Arc::new(pki.client_config(certificate))),
        ));
        let (client, mut events) = rumqttc::AsyncClient::new(options, 16);
        client
            .publish(
                "devices/dev-1/mqtt",
                rumqttc::QoS::AtLeastOnce,
                false,
                client_id.as_bytes().to_vec(),
            )
            .await
            .expect("queued");
        let acked = tokio::time::timeout(WAIT, async {
            loop {
                match events.poll().await {
                    Ok(rumqttc::Event::Incoming(rumqttc::Packet::PubAck(_))) => return Ok(()),
                    Ok(_) => {}
                    Err(error) => return Err(format!("{error:?}")),
                }
            }
        })
        .await
        .expect("a PUBACK in time");
        acked.expect("MQTT over TLS");
        let got = tokio::time::timeout(WAIT, watch.next())
            .await
            .expect("in time")
            .expect("message");
        assert_eq!(&got.payload[..], client_id.as_bytes());
    }

    // HTTPS and WSS on the HTTP port: a token, then /ws through tokio-rustls.
    let token = crate::common::issue_token(&admin, "acme", "dev-1").await;
    let http = server.http_addr.expect("http");
    let mut socket = wss(&pki, http, false, Some(&token)).await;
    let reply = ws_call(
        &mut socket,
        json!({"op": "pub", "id": "1", "subject": "devices.dev-1.ws", "data": {"t": 1}}),
    )
    .await;
    assert_eq!(reply["op"], "ok", "{reply}");

    // A client certificate alone logs in on the HTTP port too, with dev-1's rules.
    let mut socket = wss(&pki, http, true, None).await;
    for (subject, expected) in [("devices.dev-1.ws", "ok"), ("devices.dev-2.ws", "error")] {
        let request = json!({"op": "pub", "id": subject, "subject": subject, "data": 1});
        let reply = ws_call(&mut socket, request).await;
        assert_eq!(reply["op"], expected, "{subject}: {reply}");
    }

    // A clear-text HTTP request gets no answer.
    let answer = tokio::time::timeout(WAIT, async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = tokio::net::TcpStream::connect(http).await.expect("tcp");
        tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("send");
        let mut answer = Vec::new();
        let _ = tcp.read_to_end(&mut answer).await;
        answer
    })
    .await
    .expect("the server closes the connection");
    assert!(
        !answer.starts_with(b"HTTP/"),
        "clear-text HTTP was answered on a TLS port: {}",
        String::from_utf8_lossy(&answer)
    );
    server.stop().await;
}

#[test]
fn a_server_refuses_to_start_on_a_broken_certificate() {
    let pki = TestPki::new();
    let mut config = tls_config(&pki);
    config.tls.key_file = Some(pki.path("ca.pem"));
    let built = canopy::server::tls::Tls::from_config(&config.tls);
    let error = built.expect_err("a certificate as the key is refused");
    assert!(error.to_string().contains("private key"), "{error}");
    let missing = Path::new("/nonexistent/server.pem").to_path_buf();
    config.tls.cert_file = Some(missing);
    let error =
        canopy::server::tls::Tls::from_config(&config.tls).expect_err("a missing file is refused");
    assert!(
        error.to_string().contains("/nonexistent/server.pem"),
        "{error}"
    );
}
