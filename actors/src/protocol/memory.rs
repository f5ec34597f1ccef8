//! Test-time scaling by private rehearsal (DESIGN.md §1; the authors' code has none, this follows
//! the paper): the critique prompt f^(n) for one imagined trajectory, and the rehearsal memory
//! m_x condensed from the rehearsals and their critiques.
//!
//! **Bound.** m_x never exceeds `max_chars` characters, whatever N: each rehearsal gets an equal
//! share of the budget (its calls with their predicted results, its ending and its critique, cut
//! with `…`). Sequential rehearsal n is shown the memory of rehearsals `< n` built the same way,
//! so its prompt grows by at most `max_chars` characters too — the truncation that keeps
//! N = 3 from diluting the context (the paper saw N = 3 fall below N = 2).

use crate::kernels::ChatMessage;
use crate::storage::{Message, MessageRole};

/// The system prompt of a critique: the same model judges its own imagined attempt.
pub const CRITIQUE_SYSTEM: &str = "You review a private rehearsal of a tool-using assistant. \
The tool results in it were imagined, not real. In at most four short lines say: what worked, \
what failed, which calls look risky (wrong tool, wrong or missing arguments, wrong order), and \
what to do differently in the real attempt.";

/// Longest transcript shown to the critique, characters (its end is kept).
pub const CRITIQUE_TRANSCRIPT_CHARS: usize = 3000;

/// The header of a rehearsal memory in the Act system prompt.
pub const MEMORY_HEADER: &str = "Notes from private rehearsals of this task (imagined results, \
not real; use them to avoid mistakes):";

/// `[system, user]` messages asking for the critique of one rehearsal: the user message is the
/// conversation as `User:` / `Assistant:` / `Tool[name]:` lines (the last
/// [`CRITIQUE_TRANSCRIPT_CHARS`] characters) and how the rehearsal ended.
pub fn critique_messages(rehearsal: &[Message], ending: &str) -> Vec<ChatMessage> {
    let transcript = transcript_lines(rehearsal);
    let transcript = keep_tail(&transcript, CRITIQUE_TRANSCRIPT_CHARS);
    vec![
        ChatMessage::system(CRITIQUE_SYSTEM),
        ChatMessage::user(format!(
            "Rehearsal transcript:\n{transcript}\nIt ended with: {ending}.\nYour critique:"
        )),
    ]
}

/// The rehearsal memory m_x: [`MEMORY_HEADER`] then one entry per rehearsal (`Rehearsal i
/// (ended: …)`, its calls as `name(arguments) -> result`, `Critique: …`), at most `max_chars`
/// characters in all (see the module doc). `endings[i]` is how rehearsal i ended.
pub fn condense(
    rehearsals: &[Vec<Message>],
    endings: &[String],
    critiques: &[String],
    max_chars: usize,
) -> String {
    if rehearsals.is_empty() {
        return String::new();
    }
    let header_len = MEMORY_HEADER.chars().count() + 1;
    let share = max_chars.saturating_sub(header_len) / rehearsals.len();
    let mut out = String::from(MEMORY_HEADER);
    for (i, messages) in rehearsals.iter().enumerate() {
        let mut entry = format!(
            "\nRehearsal {} (ended: {}):",
            i + 1,
            endings.get(i).map_or("unknown", String::as_str)
        );
        for line in call_lines(messages) {
            entry.push_str("\n- ");
            entry.push_str(&line);
        }
        if let Some(c) = critiques.get(i) {
            entry.push_str("\nCritique: ");
            entry.push_str(&one_line(c, usize::MAX));
        }
        out.push_str(&keep_head(&entry, share));
    }
    keep_head(&out, max_chars)
}

/// One line per assistant call block and tool result of a conversation.
fn call_lines(messages: &[Message]) -> Vec<String> {
    let mut lines = Vec::new();
    for m in messages {
        match m.role {
            MessageRole::Assistant if m.content.contains("<tool_call>") => {
                lines.push(format!("called: {}", one_line(&m.content, 160)));
            }
            MessageRole::Tool => lines.push(format!(
                "{} returned: {}",
                m.tool_name.as_deref().unwrap_or("tool"),
                one_line(&m.content, 120)
            )),
            _ => {}
        }
    }
    lines
}

fn transcript_lines(messages: &[Message]) -> String {
    let mut out = String::new();
    for m in messages {
        let who = match m.role {
            MessageRole::User => "User".to_string(),
            MessageRole::Assistant => "Assistant".to_string(),
            MessageRole::Tool => format!("Tool[{}]", m.tool_name.as_deref().unwrap_or("?")),
            MessageRole::System => "System".to_string(),
        };
        out.push_str(&format!("{who}: {}\n", one_line(&m.content, 400)));
    }
    out
}

/// `text` on one line (newlines as spaces), at most `max` characters.
fn one_line(text: &str, max: usize) -> String {
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    keep_head(&flat, max)
}

/// The first `max` characters of `text`, the last one `…` when cut.
fn keep_head(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    if max > 0 {
        out.push('…');
    }
    out
}

/// The last `max` characters of `text`, the first one `…` when cut.
fn keep_tail(text: &str, max: usize) -> String {
    let n = text.chars().count();
    if n <= max {
        return text.to_string();
    }
    let mut out = String::from("…");
    out.extend(text.chars().skip(n - max.saturating_sub(1)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: MessageRole, content: &str, tool: Option<&str>) -> Message {
        Message {
            role,
            content: content.into(),
            tool_name: tool.map(Into::into),
            row: None,
        }
    }

    fn rehearsal(i: usize) -> Vec<Message> {
        vec![
            msg(MessageRole::User, "List the files.", None),
            msg(
                MessageRole::Assistant,
                &format!("<tool_call>\n{{\"name\": \"ls\", \"arguments\": {{\"n\": {i}}}}}\n</tool_call>"),
                None,
            ),
            msg(MessageRole::Tool, &"x".repeat(500), Some("ls")),
            msg(MessageRole::Assistant, "Done.", None),
        ]
    }

    #[test]
    fn the_memory_holds_calls_results_endings_and_critiques_within_the_bound() {
        let rs: Vec<_> = (0..3).map(rehearsal).collect();
        let endings = vec!["completed".to_string(); 3];
        let critiques = vec!["ls needs a path".to_string(); 3];
        let m = condense(&rs, &endings, &critiques, 4000);
        assert!(m.starts_with(MEMORY_HEADER));
        for i in 1..=3 {
            assert!(
                m.contains(&format!("Rehearsal {i} (ended: completed)")),
                "{m}"
            );
        }
        assert!(m.contains("\"n\": 2") && m.contains("ls returned: xxx"));
        assert!(m.contains("Critique: ls needs a path"));
        for bound in [200, 500, 1000] {
            for n in 1..=3 {
                let m = condense(&rs[..n], &endings, &critiques, bound);
                assert!(
                    m.chars().count() <= bound,
                    "n {n}, bound {bound}: {}",
                    m.len()
                );
                assert!(m.contains(&format!("Rehearsal {n}")) || bound < 300, "{m}");
            }
        }
        assert_eq!(condense(&[], &[], &[], 100), "");
    }

    #[test]
    fn the_critique_prompt_shows_the_end_of_a_long_transcript() {
        let mut r = rehearsal(1);
        r.insert(0, msg(MessageRole::User, &"early ".repeat(2000), None));
        let m = critique_messages(&r, "act_parse_error");
        assert_eq!(m.len(), 2);
        assert!(m[1].content.contains("Tool[ls]: xxx"));
        assert!(m[1].content.contains("It ended with: act_parse_error."));
        assert!(m[1].content.chars().count() < CRITIQUE_TRANSCRIPT_CHARS + 200);
    }
}
