//! The server log: one line per event on stderr, whatever the logged values hold.
//!
//! Values that users chose (dataset names, transform uids, ids taken from paths, error texts
//! quoting a request) reach log fields and messages. A newline in one would start a line of
//! its own that reads like a genuine event ("log forgery"), and a terminal escape could
//! rewrite what an operator sees. [`EscapingFields`] formats every field and message of every
//! event and span, so no call site can forget: control characters are written as Rust
//! escapes (`\n`, `\r`, `\t`, `\u{1b}`), and an event is always exactly one line.

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::Writer;

/// Logs go to stderr so that stdout carries only what a command prints for scripts (keys).
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn"));
    use std::io::IsTerminal as _;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .fmt_fields(EscapingFields)
        .with_writer(std::io::stderr)
        .init();
}

/// Formats fields as `name=value` separated by spaces, the message first and bare, with
/// every control character escaped.
#[derive(Debug, Clone, Copy, Default)]
pub struct EscapingFields;

impl<'writer> FormatFields<'writer> for EscapingFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'writer>, fields: R) -> fmt::Result {
        let mut visitor = EscapingVisitor { writer, first: true, result: Ok(()) };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct EscapingVisitor<'writer> {
    writer: Writer<'writer>,
    first: bool,
    result: fmt::Result,
}

impl EscapingVisitor<'_> {
    fn write(&mut self, field: &Field, value: &dyn fmt::Display) {
        if self.result.is_err() {
            return;
        }
        let separator = if self.first { "" } else { " " };
        self.first = false;
        let name = field.name();
        self.result = if name == "message" {
            write!(self.writer, "{separator}")
        } else {
            // `r#type` and the like: the name without the raw-identifier prefix.
            write!(self.writer, "{separator}{}=", name.strip_prefix("r#").unwrap_or(name))
        }
        .and_then(|()| {
            let mut escaped = Escaper { inner: &mut self.writer };
            write!(escaped, "{value}")
        });
    }
}

impl Visit for EscapingVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.write(field, &value);
        } else {
            // Quoted like the default formatter, so spaces inside a value stay readable.
            self.write(field, &format_args!("{value:?}"));
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.write(field, &value);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.write(field, &format_args!("{value:?}"));
    }
}

/// Passes text through, escaping control characters.
struct Escaper<'a, W: fmt::Write> {
    inner: &'a mut W,
}

impl<W: fmt::Write> fmt::Write for Escaper<'_, W> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        let mut rest = text;
        while let Some(at) = rest.find(char::is_control) {
            self.inner.write_str(&rest[..at])?;
            let control = rest[at..].chars().next().unwrap_or_default();
            match control {
                '\n' => self.inner.write_str("\\n")?,
                '\r' => self.inner.write_str("\\r")?,
                '\t' => self.inner.write_str("\\t")?,
                other => write!(self.inner, "\\u{{{:x}}}", u32::from(other))?,
            }
            rest = &rest[at + control.len_utf8()..];
        }
        self.inner.write_str(rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn escaped(text: &str) -> String {
        let mut out = String::new();
        write!(Escaper { inner: &mut out }, "{text}").unwrap();
        out
    }

    #[test]
    fn control_characters_are_escaped_and_the_rest_kept() {
        assert_eq!(escaped("plain ünïcode"), "plain ünïcode");
        assert_eq!(escaped("x\n2026 WARN FORGED"), "x\\n2026 WARN FORGED");
        assert_eq!(escaped("a\r\tb\u{1b}[31mc\u{7f}"), "a\\r\\tb\\u{1b}[31mc\\u{7f}");
        assert_eq!(escaped("\u{85}end\n"), "\\u{85}end\\n");
    }
}
