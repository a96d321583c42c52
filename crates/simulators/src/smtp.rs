//! An SMTP sink: a small real SMTP server (RFC 5321: EHLO/HELO, MAIL FROM,
//! RCPT TO, DATA, RSET, NOOP, QUIT) that accepts mail on loopback and
//! records every accepted message in a [`Ledger`] as `email.received`, with
//! the key taken from its `X-Saga-Key` header.
//!
//! SMTP is not HTTP, so its faults are set on the [`SmtpSink`] handle:
//! a recipient rejected with 550, transient 451 replies to RCPT, a
//! connection dropped after the DATA terminator without a reply (the
//! message *was* received: the effect happened), and a delay before the
//! final reply.

use super::Ledger;
use serde_json::{json, Map, Value};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// The largest message the sink takes (advertised as `SIZE`).
const MAX_MESSAGE_BYTES: usize = 10 * 1024 * 1024;
/// The longest command line taken (RFC 5321 §4.5.3.1.4 says 512 octets;
/// this is generous).
const MAX_LINE_BYTES: usize = 4096;
const HOSTNAME: &str = "smtp-sink.saga-harness.test";

/// A running SMTP sink. Dropping it stops the server and its connections.
pub struct SmtpSink {
    addr: SocketAddr,
    ledger: Ledger,
    faults: Arc<Mutex<SinkFaults>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default, Clone)]
pub(crate) struct SinkFaults {
    rejected: BTreeSet<String>,
    transient_rcpt: u32,
    drop_after_data: u32,
    delay_final_reply: Option<(Duration, u32)>,
}

/// What to do at the end of one message's data, decided once per message.
enum Ending {
    Reply,
    Drop,
    DelayThenReply(Duration),
}

impl SmtpSink {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every message accepted, as `email.received` effects.
    pub fn ledger(&self) -> Ledger {
        self.ledger.clone()
    }

    /// Answers `RCPT TO:<address>` with 550 from now on.
    pub fn reject_recipient(&self, address: &str) {
        self.faults().rejected.insert(address.to_ascii_lowercase());
    }

    /// Answers the next `times` `RCPT TO` commands with 451 (try later).
    pub fn fail_transiently(&self, times: u32) {
        self.faults().transient_rcpt = times;
    }

    /// For the next `times` messages: take the data, record the message,
    /// then close the connection without the final reply.
    pub fn drop_after_data(&self, times: u32) {
        Self::set_drop_after_data(&self.faults, times);
    }

    /// For the next `times` messages: record the message, then wait
    /// `delay` before the final 250.
    pub fn delay_final_reply(&self, delay: Duration, times: u32) {
        self.faults().delay_final_reply = Some((delay, times));
    }

    pub fn clear_faults(&self) {
        *self.faults() = SinkFaults::default();
    }

    /// The fault switches, shared: the mailbox serves them over HTTP so
    /// tests in another process (the browser tests) can set them.
    pub(crate) fn shared_faults(&self) -> Arc<Mutex<SinkFaults>> {
        self.faults.clone()
    }

    /// Over HTTP: `{"drop_after_data": n}` drops the line after the next
    /// `n` messages' data, as [`SmtpSink::drop_after_data`] does.
    pub(crate) fn set_drop_after_data(faults: &Mutex<SinkFaults>, times: u32) {
        faults.lock().expect("smtp faults lock").drop_after_data = times;
    }

    fn faults(&self) -> std::sync::MutexGuard<'_, SinkFaults> {
        self.faults.lock().expect("smtp faults lock")
    }
}

impl Drop for SmtpSink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts a sink on `addr` (port 0 picks a free port) with its own ledger.
pub async fn start(addr: SocketAddr) -> std::io::Result<SmtpSink> {
    start_with(addr, Ledger::default()).await
}

/// Starts a sink that records into `ledger` (shared with other simulators).
pub async fn start_with(addr: SocketAddr, ledger: Ledger) -> std::io::Result<SmtpSink> {
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let faults = Arc::new(Mutex::new(SinkFaults::default()));
    let session = Session {
        ledger: ledger.clone(),
        faults: faults.clone(),
    };
    let task = tokio::spawn(async move {
        // Connections live in the set, so stopping the sink ends them too.
        let mut connections = JoinSet::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    if let Ok((stream, _)) = accepted {
                        let session = session.clone();
                        connections.spawn(async move {
                            let _ = session.serve(stream).await;
                        });
                    }
                }
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
    });
    Ok(SmtpSink {
        addr,
        ledger,
        faults,
        task,
    })
}

#[derive(Clone)]
struct Session {
    ledger: Ledger,
    faults: Arc<Mutex<SinkFaults>>,
}

/// One mail transaction (RFC 5321 §3.3).
#[derive(Default)]
struct Transaction {
    from: Option<String>,
    recipients: Vec<String>,
}

impl Session {
    async fn serve(&self, stream: TcpStream) -> std::io::Result<()> {
        let (read, mut write) = stream.into_split();
        let mut reader = BufReader::new(read);
        write
            .write_all(format!("220 {HOSTNAME} ESMTP saga-harness sink\r\n").as_bytes())
            .await?;
        let mut greeted = false;
        let mut transaction = Transaction::default();
        loop {
            let Some(line) = read_line(&mut reader, MAX_LINE_BYTES).await? else {
                return Ok(());
            };
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\r', '\n']);
            let (verb, rest) = line.split_once(' ').unwrap_or((line, ""));
            let reply = match verb.to_ascii_uppercase().as_str() {
                "EHLO" if rest.trim().is_empty() => "501 5.5.4 Syntax: EHLO hostname".to_owned(),
                "EHLO" => {
                    greeted = true;
                    transaction = Transaction::default();
                    format!(
                        "250-{HOSTNAME} greets {}\r\n250-8BITMIME\r\n250-SMTPUTF8\r\n250-ENHANCEDSTATUSCODES\r\n250 SIZE {MAX_MESSAGE_BYTES}",
                        rest.trim()
                    )
                }
                "HELO" if rest.trim().is_empty() => "501 5.5.4 Syntax: HELO hostname".to_owned(),
                "HELO" => {
                    greeted = true;
                    transaction = Transaction::default();
                    format!("250 {HOSTNAME}")
                }
                "MAIL" if !greeted => "503 5.5.1 Error: send HELO/EHLO first".to_owned(),
                "MAIL" if transaction.from.is_some() => {
                    "503 5.5.1 Error: nested MAIL command".to_owned()
                }
                "MAIL" => match path_after(rest, "FROM:") {
                    Some(from) => {
                        transaction.from = Some(from);
                        "250 2.1.0 OK".to_owned()
                    }
                    None => "501 5.5.4 Syntax: MAIL FROM:<address>".to_owned(),
                },
                "RCPT" if transaction.from.is_none() => {
                    "503 5.5.1 Error: need MAIL command".to_owned()
                }
                "RCPT" => match path_after(rest, "TO:") {
                    Some(to) => self.recipient(&mut transaction, to),
                    None => "501 5.5.4 Syntax: RCPT TO:<address>".to_owned(),
                },
                "DATA" if transaction.recipients.is_empty() => {
                    "503 5.5.1 Error: need RCPT command".to_owned()
                }
                "DATA" => {
                    write
                        .write_all(b"354 End data with <CR><LF>.<CR><LF>\r\n")
                        .await?;
                    let Some(data) = read_data(&mut reader).await? else {
                        return Ok(());
                    };
                    let finished = std::mem::take(&mut transaction);
                    match data {
                        Err(too_big) => too_big,
                        Ok(data) => match self.deliver(finished, &data) {
                            Ending::Drop => return Ok(()),
                            Ending::DelayThenReply(delay) => {
                                tokio::time::sleep(delay).await;
                                "250 2.0.0 OK: queued".to_owned()
                            }
                            Ending::Reply => "250 2.0.0 OK: queued".to_owned(),
                        },
                    }
                }
                "RSET" => {
                    transaction = Transaction::default();
                    "250 2.0.0 OK".to_owned()
                }
                "NOOP" => "250 2.0.0 OK".to_owned(),
                "VRFY" => "252 2.0.0 Cannot VRFY user, but will accept message".to_owned(),
                "QUIT" => {
                    write.write_all(b"221 2.0.0 Bye\r\n").await?;
                    return Ok(());
                }
                "" => "500 5.5.2 Error: bad syntax".to_owned(),
                _ => "502 5.5.2 Error: command not recognized".to_owned(),
            };
            write.write_all(format!("{reply}\r\n").as_bytes()).await?;
        }
    }

    fn recipient(&self, transaction: &mut Transaction, to: String) -> String {
        let mut faults = self.faults.lock().expect("smtp faults lock");
        if faults.transient_rcpt > 0 {
            faults.transient_rcpt -= 1;
            return "451 4.3.0 Requested action aborted: local error in processing".to_owned();
        }
        if faults.rejected.contains(&to.to_ascii_lowercase()) {
            return format!("550 5.1.1 <{to}>: Recipient address rejected: User unknown");
        }
        transaction.recipients.push(to);
        "250 2.1.5 OK".to_owned()
    }

    /// Records the message (the effect) and says how the reply goes.
    fn deliver(&self, transaction: Transaction, data: &[u8]) -> Ending {
        let message = ReceivedMessage::parse(data);
        let key = message.header("X-Saga-Key");
        let message_id = message.header("Message-ID");
        self.ledger.record(
            "smtp",
            "email.received",
            key.as_deref(),
            message_id.as_deref().unwrap_or(""),
            json!({
                "from": transaction.from,
                "to": transaction.recipients,
                "message_id": message_id,
                "subject": message.header("Subject"),
                "headers": message.headers_json(),
                "body": message.body,
            }),
        );
        let mut faults = self.faults.lock().expect("smtp faults lock");
        if faults.drop_after_data > 0 {
            faults.drop_after_data -= 1;
            return Ending::Drop;
        }
        match &mut faults.delay_final_reply {
            Some((delay, times)) if *times > 0 => {
                *times -= 1;
                Ending::DelayThenReply(*delay)
            }
            _ => Ending::Reply,
        }
    }
}

/// The address in `FROM:<a@b> PARAMS` / `TO:<a@b>`; `""` for the null
/// reverse path `<>`.
fn path_after(rest: &str, prefix: &str) -> Option<String> {
    let rest = rest.trim_start();
    if rest.len() < prefix.len() || !rest[..prefix.len()].eq_ignore_ascii_case(prefix) {
        return None;
    }
    let rest = rest[prefix.len()..].trim_start();
    let inner = rest.strip_prefix('<')?;
    let end = inner.find('>')?;
    Some(inner[..end].to_owned())
}

/// One line including its ending; `None` at end of stream. A line longer
/// than `limit` is cut there (the rest comes as further lines).
async fn read_line<R: AsyncBufReadExt + Unpin>(
    reader: &mut R,
    limit: usize,
) -> std::io::Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok((!line.is_empty()).then_some(line));
        }
        let room = limit.saturating_sub(line.len()).max(1);
        let take = match available.iter().position(|b| *b == b'\n') {
            Some(end) if end < room => end + 1,
            _ => available.len().min(room),
        };
        line.extend_from_slice(&available[..take]);
        reader.consume(take);
        if line.ends_with(b"\n") || line.len() >= limit {
            return Ok(Some(line));
        }
    }
}

/// The message data up to the `.` line, dot-unstuffed (RFC 5321
/// §4.5.2). `None` when the client went away first; `Some(Err(reply))`
/// when the message was too large.
async fn read_data<R: AsyncBufReadExt + Unpin>(
    reader: &mut R,
) -> std::io::Result<Option<Result<Vec<u8>, String>>> {
    let mut data = Vec::new();
    let mut too_big = false;
    loop {
        let Some(line) = read_line(reader, 64 * 1024).await? else {
            return Ok(None);
        };
        if line == b".\r\n" || line == b".\n" {
            return Ok(Some(if too_big {
                Err("552 5.3.4 Error: message too large".to_owned())
            } else {
                Ok(data)
            }));
        }
        let line = line.strip_prefix(b".").unwrap_or(&line);
        if data.len() + line.len() > MAX_MESSAGE_BYTES {
            too_big = true;
        } else {
            data.extend_from_slice(line);
        }
    }
}

/// A received message split into its header fields and body.
struct ReceivedMessage {
    headers: Vec<(String, String)>,
    body: String,
}

impl ReceivedMessage {
    fn parse(data: &[u8]) -> Self {
        let text = String::from_utf8_lossy(data).replace("\r\n", "\n");
        let (head, body) = text.split_once("\n\n").unwrap_or((&text, ""));
        let mut headers: Vec<(String, String)> = Vec::new();
        for line in head.lines() {
            if line.starts_with([' ', '\t']) {
                // A folded continuation of the previous field.
                if let Some((_, value)) = headers.last_mut() {
                    value.push(' ');
                    value.push_str(line.trim());
                }
            } else if let Some((name, value)) = line.split_once(':') {
                headers.push((name.trim().to_owned(), value.trim().to_owned()));
            }
        }
        ReceivedMessage {
            headers,
            body: body.to_owned(),
        }
    }

    fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    }

    fn headers_json(&self) -> Value {
        let mut map = Map::new();
        for (name, value) in &self.headers {
            map.insert(name.clone(), Value::String(value.clone()));
        }
        Value::Object(map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_read_from_mail_and_rcpt() {
        assert_eq!(
            path_after("FROM:<a@example.com> BODY=8BITMIME", "FROM:"),
            Some("a@example.com".into())
        );
        assert_eq!(path_after("from: <>", "FROM:"), Some(String::new()));
        assert_eq!(path_after("TO:b@example.com", "TO:"), None);
    }

    #[test]
    fn headers_are_unfolded_and_the_body_kept() {
        let message = ReceivedMessage::parse(
            b"Message-ID: <k1@saga-harness>\r\nSubject: a long\r\n subject\r\nX-Saga-Key: k1\r\n\r\nHello\r\n",
        );
        assert_eq!(message.header("x-saga-key"), Some("k1".into()));
        assert_eq!(message.header("Subject"), Some("a long subject".into()));
        assert_eq!(message.body, "Hello\n");
    }

    #[tokio::test]
    async fn data_is_dot_unstuffed_up_to_the_terminator() {
        let input: &[u8] = b"line one\r\n..starts with a dot\r\n.\r\nQUIT\r\n";
        let mut reader = BufReader::new(input);
        let data = read_data(&mut reader).await.unwrap().unwrap().unwrap();
        assert_eq!(data, b"line one\r\n.starts with a dot\r\n");
    }
}
