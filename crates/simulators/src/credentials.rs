//! Reading the credentials a request to a simulator presents.
//!
//! Simulators accept any well-formed credential (they guard nothing); what
//! they check is the *scheme* the real system insists on, so a connector
//! that sends a bearer token where Basic is required meets the 401 it would
//! meet in life.

use axum::http::{header, HeaderMap};

/// The `user:password` pair of an `Authorization: Basic …` header.
pub fn basic(headers: &HeaderMap) -> Option<(String, String)> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let encoded = value.strip_prefix("Basic ")?.trim();
    let decoded = String::from_utf8(decode_base64(encoded)?).ok()?;
    let (user, password) = decoded.split_once(':')?;
    (!user.is_empty() && !password.is_empty()).then(|| (user.to_owned(), password.to_owned()))
}

/// The token of an `Authorization: Bearer …` header.
pub fn bearer(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let token = value.strip_prefix("Bearer ")?.trim();
    (!token.is_empty()).then(|| token.to_owned())
}

/// Standard base64 with padding (RFC 4648 §4), as HTTP Basic uses it.
fn decode_base64(text: &str) -> Option<Vec<u8>> {
    fn sextet(c: u8) -> Option<u32> {
        match c {
            b'A'..=b'Z' => Some(u32::from(c - b'A')),
            b'a'..=b'z' => Some(u32::from(c - b'a') + 26),
            b'0'..=b'9' => Some(u32::from(c - b'0') + 52),
            b'+' => Some(62),
            b'/' => Some(63),
            _ => None,
        }
    }
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    for chunk in bytes.chunks(4) {
        let padding = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        if padding > 2 {
            return None;
        }
        let mut word = 0u32;
        for &c in &chunk[..4 - padding] {
            word = (word << 6) | sextet(c)?;
        }
        word <<= 6 * padding as u32;
        let group = [(word >> 16) as u8, (word >> 8) as u8, word as u8];
        out.extend_from_slice(&group[..3 - padding]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn with(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn basic_credentials_decode_with_and_without_padding() {
        // "agent@example.com/token:abc" and "a:bc"
        assert_eq!(
            basic(&with("Basic YWdlbnRAZXhhbXBsZS5jb20vdG9rZW46YWJj")),
            Some(("agent@example.com/token".into(), "abc".into()))
        );
        assert_eq!(
            basic(&with("Basic YTpiYw==")),
            Some(("a".into(), "bc".into()))
        );
        assert_eq!(basic(&with("Basic not base64!")), None);
        assert_eq!(basic(&with("Bearer abc")), None);
    }

    #[test]
    fn bearer_tokens_are_read_and_empty_ones_refused() {
        assert_eq!(bearer(&with("Bearer pat-1")), Some("pat-1".into()));
        assert_eq!(bearer(&with("Bearer ")), None);
        assert_eq!(bearer(&with("Basic YTpiYw==")), None);
    }
}
