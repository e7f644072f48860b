//! Logging a native client in when the server requires logins: INFO, then CONNECT
//! within the login timeout, checked by `tenancy::login`; on success the connection
//! acts as that user in that user's tenant. Never handles an op after CONNECT.

use super::*;

impl Connection {
    /// Sends INFO, waits for CONNECT and logs the client in: on success the
    /// connection acts as that user in that user's tenant, and what followed CONNECT
    /// in `rbuf` is handled; on failure the reason to send before closing.
    pub(super) async fn log_in(
        &mut self,
        info: &ServerInfo,
        info_sent: bool,
        reader: &mut (impl AsyncRead + Unpin),
        writer: &mut (impl AsyncWrite + Unpin),
        rbuf: &mut BytesMut,
    ) -> Result<(), &'static str> {
        if !info_sent {
            let mut first = BytesMut::new();
            encode_info(&mut first, info);
            writer.write_all(&first).await.map_err(|_| "gone")?;
        }
        let deadline = tokio::time::Instant::now() + LOGIN_TIMEOUT;
        let op = loop {
            match self.decoder.decode(rbuf) {
                Ok(Some(op)) => break op,
                Ok(None) => {}
                Err(error) => return Err(error.nats_text()),
            }
            match tokio::time::timeout_at(deadline, reader.read_buf(rbuf)).await {
                Ok(Ok(n)) if n > 0 => {}
                Ok(_) => return Err("gone"),
                Err(_) => return Err("Authorization Timeout"),
            }
        };
        let ClientOp::Connect(options) = op else {
            return Err("Authorization Violation");
        };
        let presented = crate::tenancy::login::Presented {
            user: options.user.clone(),
            password: options.pass.clone(),
            token: options.auth_token.clone(),
            certified: self.certified.clone(),
            client: options
                .name
                .clone()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| format!("native-{}", self.id)),
        };
        let Some(users) = self.broker.users() else {
            return Err("Authorization Violation");
        };
        let login = crate::tenancy::login::login(
            users,
            self.broker.tenant_records(),
            self.broker.metrics(),
            &presented,
        );
        match login.await {
            Ok(principal) => {
                self.session.log_in(principal);
                self.connect(&options)
                    .map_err(|_| "Authorization Violation")?;
                // What followed CONNECT waits for the connection's slot (`serve`).
                Ok(())
            }
            Err(crate::tenancy::login::LoginRefused) => {
                tokio::time::sleep(crate::tenancy::login::FAILED_LOGIN_DELAY).await;
                Err("Authorization Violation")
            }
        }
    }
}
