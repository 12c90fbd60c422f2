//! The client side of SCRAM (RFC 5802, RFC 7677) as Kafka speaks it in `SaslAuthenticate`:
//! client-first, server-first, client-final with the proof, and the server's signature
//! checked — a broker that does not know the password cannot pass itself off as one.
//!
//! HMAC, PBKDF2 and the digests come from aws-lc-rs, the provider rustls already uses.

use aws_lc_rs::{digest, hmac, pbkdf2};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use std::num::NonZeroU32;

/// SCRAM-SHA-256 or SCRAM-SHA-512.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScramHash {
    Sha256,
    Sha512,
}

impl ScramHash {
    fn hmac(self) -> hmac::Algorithm {
        match self {
            ScramHash::Sha256 => hmac::HMAC_SHA256,
            ScramHash::Sha512 => hmac::HMAC_SHA512,
        }
    }

    fn pbkdf2(self) -> pbkdf2::Algorithm {
        match self {
            ScramHash::Sha256 => pbkdf2::PBKDF2_HMAC_SHA256,
            ScramHash::Sha512 => pbkdf2::PBKDF2_HMAC_SHA512,
        }
    }

    fn digest(self) -> &'static digest::Algorithm {
        match self {
            ScramHash::Sha256 => &digest::SHA256,
            ScramHash::Sha512 => &digest::SHA512,
        }
    }

    fn len(self) -> usize {
        match self {
            ScramHash::Sha256 => 32,
            ScramHash::Sha512 => 64,
        }
    }
}

/// Iterations a server may ask for at most (Kafka's own limit is 16,384).
const MAX_ITERATIONS: u32 = 1 << 20;

/// One SCRAM exchange, after the client-first message.
#[derive(Debug)]
pub(crate) struct Scram {
    hash: ScramHash,
    password: String,
    client_first_bare: String,
    nonce: String,
    server_signature: Option<Vec<u8>>,
}

impl Scram {
    /// Starts an exchange for `username` with a fresh random nonce; returns it and the
    /// client-first message.
    pub(crate) fn start(hash: ScramHash, username: &str, password: &str) -> Result<(Scram, Vec<u8>), String> {
        let mut raw = [0u8; 24];
        aws_lc_rs::rand::fill(&mut raw).map_err(|_| "no random bytes for the SCRAM nonce".to_string())?;
        Ok(Self::start_with_nonce(hash, username, password, &B64.encode(raw)))
    }

    fn start_with_nonce(hash: ScramHash, username: &str, password: &str, nonce: &str) -> (Scram, Vec<u8>) {
        let name = username.replace('=', "=3D").replace(',', "=2C");
        let client_first_bare = format!("n={name},r={nonce}");
        let first = format!("n,,{client_first_bare}").into_bytes();
        let scram = Scram {
            hash,
            password: password.to_owned(),
            client_first_bare,
            nonce: nonce.to_owned(),
            server_signature: None,
        };
        (scram, first)
    }

    /// The client-final message (with the proof) answering `server_first`.
    pub(crate) fn answer(&mut self, server_first: &[u8]) -> Result<Vec<u8>, String> {
        let server_first = std::str::from_utf8(server_first)
            .map_err(|_| "the server's first message is not UTF-8".to_string())?;
        let field = |k: &str| {
            server_first
                .split(',')
                .find_map(|f| f.strip_prefix(k))
                .ok_or_else(|| format!("the server's first message has no `{k}` (it said `{server_first}`)"))
        };
        let nonce = field("r=")?;
        if !nonce.starts_with(&self.nonce) || nonce.len() == self.nonce.len() {
            return Err("the server's nonce does not extend ours".into());
        }
        let salt = B64.decode(field("s=")?).map_err(|e| format!("the server's salt: {e}"))?;
        let iterations: u32 =
            field("i=")?.parse().map_err(|e| format!("the server's iteration count: {e}"))?;
        let iterations = NonZeroU32::new(iterations)
            .filter(|i| i.get() <= MAX_ITERATIONS)
            .ok_or_else(|| format!("the server asks for {iterations} iterations"))?;
        let mut salted = vec![0u8; self.hash.len()];
        pbkdf2::derive(self.hash.pbkdf2(), iterations, &salt, self.password.as_bytes(), &mut salted);
        let salted = hmac::Key::new(self.hash.hmac(), &salted);
        let client_key = hmac::sign(&salted, b"Client Key");
        let stored_key = digest::digest(self.hash.digest(), client_key.as_ref());
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{server_first},{without_proof}", self.client_first_bare);
        let signature =
            hmac::sign(&hmac::Key::new(self.hash.hmac(), stored_key.as_ref()), auth_message.as_bytes());
        let proof: Vec<u8> = client_key.as_ref().iter().zip(signature.as_ref()).map(|(k, s)| k ^ s).collect();
        let server_key = hmac::sign(&salted, b"Server Key");
        let server_signature =
            hmac::sign(&hmac::Key::new(self.hash.hmac(), server_key.as_ref()), auth_message.as_bytes());
        self.server_signature = Some(server_signature.as_ref().to_vec());
        Ok(format!("{without_proof},p={}", B64.encode(proof)).into_bytes())
    }

    /// Checks the server-final message: the server proves it knows the password too.
    pub(crate) fn verify(&self, server_final: &[u8]) -> Result<(), String> {
        let text =
            std::str::from_utf8(server_final).map_err(|_| "the server's final message is not UTF-8")?;
        if let Some(e) = text.strip_prefix("e=") {
            return Err(format!("the server refused: {e}"));
        }
        let given = text
            .split(',')
            .find_map(|f| f.strip_prefix("v="))
            .ok_or_else(|| format!("the server's final message has no signature (`{text}`)"))?;
        let given = B64.decode(given).map_err(|e| format!("the server's signature: {e}"))?;
        match &self.server_signature {
            Some(want) if *want == given => Ok(()),
            _ => Err("the server's signature is wrong: it does not know the password".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677, section 3: user `user`, password `pencil`.
    #[test]
    fn the_rfc_7677_exchange() {
        let (mut scram, first) =
            Scram::start_with_nonce(ScramHash::Sha256, "user", "pencil", "rOprNGfwEbeRWgbNEkqO");
        assert_eq!(first, b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let server_first =
            b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let last = scram.answer(server_first).unwrap();
        assert_eq!(
            String::from_utf8(last).unwrap(),
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        scram.verify(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=").unwrap();
        assert!(scram.verify(b"v=AAAATRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=").is_err());
        assert!(scram.verify(b"e=invalid-proof").unwrap_err().contains("invalid-proof"));
    }

    #[test]
    fn a_server_that_does_not_extend_our_nonce_or_asks_too_much_is_refused() {
        let (mut scram, _) = Scram::start_with_nonce(ScramHash::Sha512, "a,b=c", "p", "abc");
        assert!(scram.answer(b"r=xyz,s=c2FsdA==,i=4096").is_err());
        assert!(scram.answer(b"r=abcd,s=c2FsdA==,i=0").is_err());
        assert!(scram.answer(b"r=abcd,s=c2FsdA==,i=99999999").is_err());
        assert_eq!(scram.client_first_bare, "n=a=2Cb=3Dc,r=abc");
        assert!(scram.answer(b"r=abcd,s=c2FsdA==,i=4096").is_ok());
    }
}
