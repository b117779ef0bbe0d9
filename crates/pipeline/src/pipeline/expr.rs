//! GitLab's CI/CD expression language, as `rules:if`, `workflow:rules:if` and
//! `only/except:variables` use it.
//!
//! Operands: `$VAR`, `"string"` / `'string'` (no escapes, no expansion), `null`,
//! and `/regex/flags` (RE2 syntax, flags `i`, `m`, `s`). Operators: `==`, `!=`, `=~`, `!~`,
//! `&&` (binds tighter), `||`, and parentheses. A lone operand is true when it is a non-blank
//! string. As in GitLab: an undefined variable is `null`; `null` matched against a pattern is
//! matched as the empty string; the right side of `=~` may be a variable (or string) holding
//! `/regex/flags`; a string that is no pattern is searched for the left side's value (GitLab
//! calls Ruby's `String#scan` on it, so an unset left side matches any string), and null on
//! the right matches nothing.
//!
//! `${VAR}` is no variable to GitLab's lexer (its pattern is `$` and word characters): GitLab
//! refuses the file ("invalid expression syntax"; its docs list `if: ${ENVIRONMENT} == "x"` as
//! invalid), and so does this reader, saying to write `$VAR`.

use std::fmt;

use regex::Regex;

/// Longest expression accepted (GitLab's limit on `if:` is similar), and the deepest nesting.
const MAX_LEN: usize = 4096;
const MAX_DEPTH: usize = 32;

/// A parsed expression.
#[derive(Debug, Clone)]
pub(crate) struct Expr {
    root: Node,
}

#[derive(Debug, Clone)]
enum Node {
    Operand(Operand),
    Compare(Operand, Op, Operand),
    And(Box<Node>, Box<Node>),
    Or(Box<Node>, Box<Node>),
}

#[derive(Debug, Clone)]
enum Operand {
    Var(String),
    Str(String),
    Null,
    Pattern(Pattern),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Eq,
    Ne,
    Match,
    NoMatch,
}

/// A compiled `/regex/flags`, with its source for equality.
#[derive(Debug, Clone)]
struct Pattern {
    source: String,
    regex: Regex,
}

/// Why an expression could not be parsed: the message says where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ExprError(pub String);

impl fmt::Display for ExprError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Var(String),
    Str(String),
    Null,
    Pattern(String, String),
    Op(Op),
    And,
    Or,
    Open,
    Close,
}

impl Expr {
    /// Parses `text`; the error names the column and what was expected.
    pub(crate) fn parse(text: &str) -> Result<Expr, ExprError> {
        if text.len() > MAX_LEN {
            return Err(ExprError(format!(
                "expression longer than {MAX_LEN} characters"
            )));
        }
        let tokens = lex(text)?;
        if tokens.is_empty() {
            return Err(ExprError("empty expression".into()));
        }
        let mut p = Parser {
            tokens: &tokens,
            pos: 0,
        };
        let root = p.or(0)?;
        if let Some((t, col)) = p.tokens.get(p.pos) {
            return Err(ExprError(format!(
                "unexpected {} at column {col}",
                describe(t)
            )));
        }
        Ok(Expr { root })
    }

    /// Evaluates with `lookup` giving each variable's value (`None` when undefined).
    pub(crate) fn eval(&self, lookup: &dyn Fn(&str) -> Option<String>) -> bool {
        eval(&self.root, lookup)
    }
}

fn describe(t: &Token) -> String {
    match t {
        Token::Var(n) => format!("variable ${n}"),
        Token::Str(s) => format!("string \"{s}\""),
        Token::Null => "null".into(),
        Token::Pattern(p, f) => format!("pattern /{p}/{f}"),
        Token::Op(Op::Eq) => "\"==\"".into(),
        Token::Op(Op::Ne) => "\"!=\"".into(),
        Token::Op(Op::Match) => "\"=~\"".into(),
        Token::Op(Op::NoMatch) => "\"!~\"".into(),
        Token::And => "\"&&\"".into(),
        Token::Or => "\"||\"".into(),
        Token::Open => "\"(\"".into(),
        Token::Close => "\")\"".into(),
    }
}

fn is_name(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Tokens with their 1-based columns.
fn lex(text: &str) -> Result<Vec<(Token, usize)>, ExprError> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let col = i + 1;
        let two: String = chars[i..chars.len().min(i + 2)].iter().collect();
        match c {
            _ if c.is_whitespace() => {
                i += 1;
                continue;
            }
            '$' => {
                let (name, next) = if chars.get(i + 1) == Some(&'{') {
                    let end = chars[i + 2..]
                        .iter()
                        .position(|&c| c == '}')
                        .map(|p| p + i + 2)
                        .ok_or_else(|| ExprError(format!("unclosed \"${{\" at column {col}")))?;
                    (chars[i + 2..end].iter().collect::<String>(), end + 1)
                } else {
                    let end = chars[i + 1..]
                        .iter()
                        .position(|&c| !is_name(c))
                        .map_or(chars.len(), |p| p + i + 1);
                    (chars[i + 1..end].iter().collect::<String>(), end)
                };
                if name.is_empty() || !name.chars().all(is_name) {
                    return Err(ExprError(format!(
                        "expected a variable name after \"$\" at column {col}"
                    )));
                }
                if chars.get(i + 1) == Some(&'{') {
                    return Err(ExprError(format!(
                        "\"${{{name}}}\" at column {col} is not a variable in GitLab's \
                         expressions (write ${name})"
                    )));
                }
                out.push((Token::Var(name), col));
                i = next;
            }
            '"' | '\'' => {
                let end = chars[i + 1..]
                    .iter()
                    .position(|&q| q == c)
                    .map(|p| p + i + 1)
                    .ok_or_else(|| ExprError(format!("unclosed string at column {col}")))?;
                out.push((Token::Str(chars[i + 1..end].iter().collect()), col));
                i = end + 1;
            }
            '/' => {
                // The pattern ends at the first `/` not escaped by a backslash.
                let mut j = i + 1;
                let mut source = String::new();
                loop {
                    match chars.get(j) {
                        None => {
                            return Err(ExprError(format!("unclosed pattern at column {col}")));
                        }
                        Some('\\') if chars.get(j + 1) == Some(&'/') => {
                            source.push('/');
                            j += 2;
                        }
                        Some('\\') => {
                            source.push('\\');
                            if let Some(&n) = chars.get(j + 1) {
                                source.push(n);
                            }
                            j += 2;
                        }
                        Some('/') => break,
                        Some(&ch) => {
                            source.push(ch);
                            j += 1;
                        }
                    }
                }
                j += 1;
                let mut flags = String::new();
                while let Some(&f) = chars.get(j) {
                    if !f.is_ascii_alphabetic() {
                        break;
                    }
                    flags.push(f);
                    j += 1;
                }
                out.push((Token::Pattern(source, flags), col));
                i = j;
            }
            '(' => {
                out.push((Token::Open, col));
                i += 1;
            }
            ')' => {
                out.push((Token::Close, col));
                i += 1;
            }
            _ => {
                let tok = match two.as_str() {
                    "==" => Token::Op(Op::Eq),
                    "!=" => Token::Op(Op::Ne),
                    "=~" => Token::Op(Op::Match),
                    "!~" => Token::Op(Op::NoMatch),
                    "&&" => Token::And,
                    "||" => Token::Or,
                    _ => {
                        let word: String = chars[i..].iter().take_while(|c| is_name(**c)).collect();
                        if word == "null" {
                            out.push((Token::Null, col));
                            i += 4;
                            continue;
                        }
                        let shown = if word.is_empty() { c.to_string() } else { word };
                        return Err(ExprError(format!(
                            "unexpected \"{shown}\" at column {col} (variables start with $, strings are quoted)"
                        )));
                    }
                };
                out.push((tok, col));
                i += 2;
            }
        }
    }
    Ok(out)
}

/// Compiles `/source/flags`.
fn pattern(source: &str, flags: &str) -> Result<Pattern, String> {
    let mut prefix = String::new();
    for f in flags.chars() {
        match f {
            'i' => prefix.push('i'),
            // Ruby's /m is "dot matches newline"; RE2 calls that s.
            'm' | 's' => prefix.push('s'),
            other => return Err(format!("unknown regex flag \"{other}\" (i, m, s)")),
        }
    }
    let full = if prefix.is_empty() {
        source.to_string()
    } else {
        format!("(?{prefix}){source}")
    };
    let regex = regex::RegexBuilder::new(&full)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| format!("invalid regex /{source}/: {e}"))?;
    Ok(Pattern {
        source: format!("/{source}/{flags}"),
        regex,
    })
}

/// Whether `text` matches `value` written as `/regex/flags`; `None` when `value` is no pattern.
pub(crate) fn matches_pattern(value: &str, text: &str) -> Option<bool> {
    pattern_of_value(value).map(|p| p.regex.is_match(text))
}

/// A value written as `/regex/flags`, as a variable may hold one.
fn pattern_of_value(value: &str) -> Option<Pattern> {
    let rest = value.strip_prefix('/')?;
    let end = rest.rfind('/')?;
    pattern(&rest[..end], &rest[end + 1..]).ok()
}

struct Parser<'a> {
    tokens: &'a [(Token, usize)],
    pos: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos).map(|(t, _)| t)
    }

    fn or(&mut self, depth: usize) -> Result<Node, ExprError> {
        let mut left = self.and(depth)?;
        while self.peek() == Some(&Token::Or) {
            self.pos += 1;
            let right = self.and(depth)?;
            left = Node::Or(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn and(&mut self, depth: usize) -> Result<Node, ExprError> {
        let mut left = self.compare(depth)?;
        while self.peek() == Some(&Token::And) {
            self.pos += 1;
            let right = self.compare(depth)?;
            left = Node::And(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn compare(&mut self, depth: usize) -> Result<Node, ExprError> {
        if self.peek() == Some(&Token::Open) {
            if depth >= MAX_DEPTH {
                return Err(ExprError(format!(
                    "parentheses nested more than {MAX_DEPTH} deep"
                )));
            }
            let col = self.tokens[self.pos].1;
            self.pos += 1;
            let inner = self.or(depth + 1)?;
            if self.peek() != Some(&Token::Close) {
                return Err(ExprError(format!("\"(\" at column {col} is not closed")));
            }
            self.pos += 1;
            return Ok(inner);
        }
        let left = self.operand()?;
        let op = match self.peek() {
            Some(Token::Op(op)) => *op,
            _ => return Ok(Node::Operand(left)),
        };
        self.pos += 1;
        let right = self.operand()?;
        Ok(Node::Compare(left, op, right))
    }

    fn operand(&mut self) -> Result<Operand, ExprError> {
        let Some((tok, col)) = self.tokens.get(self.pos) else {
            return Err(ExprError(
                "expression ends where a value was expected".into(),
            ));
        };
        let op = match tok {
            Token::Var(n) => Operand::Var(n.clone()),
            Token::Str(s) => Operand::Str(s.clone()),
            Token::Null => Operand::Null,
            Token::Pattern(p, f) => Operand::Pattern(
                pattern(p, f).map_err(|e| ExprError(format!("{e} at column {col}")))?,
            ),
            other => {
                return Err(ExprError(format!(
                    "expected a value at column {col}, found {}",
                    describe(other)
                )));
            }
        };
        self.pos += 1;
        Ok(op)
    }
}

/// A string is "present" in Ruby's sense: not empty and not only white space.
fn present(s: &str) -> bool {
    !s.trim().is_empty()
}

fn value(op: &Operand, lookup: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    match op {
        Operand::Var(n) => lookup(n),
        Operand::Str(s) => Some(s.clone()),
        Operand::Null => None,
        Operand::Pattern(p) => Some(p.source.clone()),
    }
}

fn eval(node: &Node, lookup: &dyn Fn(&str) -> Option<String>) -> bool {
    match node {
        Node::Operand(Operand::Pattern(_)) => true,
        Node::Operand(op) => value(op, lookup).is_some_and(|v| present(&v)),
        Node::And(a, b) => eval(a, lookup) && eval(b, lookup),
        Node::Or(a, b) => eval(a, lookup) || eval(b, lookup),
        Node::Compare(l, Op::Eq, r) => value(l, lookup) == value(r, lookup),
        Node::Compare(l, Op::Ne, r) => value(l, lookup) != value(r, lookup),
        Node::Compare(l, op, r) => {
            let text = value(l, lookup).unwrap_or_default();
            let matched = match r {
                Operand::Pattern(p) => p.regex.is_match(&text),
                // A string, or a variable's value, that is no `/pattern/` is searched for
                // the left side's value, as GitLab's `String#scan` does: an unset or empty
                // left side is found in any string. Nothing (null) on the right matches
                // nothing.
                other => value(other, lookup).is_some_and(|v| match pattern_of_value(&v) {
                    Some(p) => p.regex.is_match(&text),
                    None => v.contains(text.as_str()),
                }),
            };
            matched == (*op == Op::Match)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(expr: &str, vars: &[(&str, &str)]) -> bool {
        let e = Expr::parse(expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
        e.eval(&|n: &str| {
            vars.iter()
                .find(|(k, _)| *k == n)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn comparisons_and_presence() {
        let v = [("BRANCH", "main"), ("EMPTY", ""), ("SPACE", "  ")];
        assert!(check("$BRANCH == \"main\"", &v));
        assert!(check("$BRANCH == 'main'", &v));
        // GitLab's lexer has no `${VAR}`: the file is refused, as GitLab refuses it.
        let e = Expr::parse("$A && ${B} == \"x\"").unwrap_err();
        assert_eq!(
            e.0,
            "\"${B}\" at column 7 is not a variable in GitLab's expressions (write $B)"
        );
        assert!(check("$BRANCH", &v));
        assert!(!check("$EMPTY", &v));
        assert!(!check("$SPACE", &v));
        assert!(!check("$UNSET", &v));
        assert!(check("$UNSET == null", &v));
        assert!(!check("$EMPTY == null", &v));
        assert!(check("$EMPTY == \"\"", &v));
        assert!(check("null == $UNSET", &v));
        assert!(check("$BRANCH == $BRANCH", &v));
    }

    #[test]
    fn patterns() {
        let v = [
            ("REF", "release/1.2"),
            ("RE", "/^release\\//"),
            ("PLAIN", "release"),
        ];
        assert!(check("$REF =~ /^release\\/\\d/", &v));
        assert!(check("$REF =~ /RELEASE/i", &v));
        assert!(!check("$REF =~ /RELEASE/", &v));
        assert!(check("$REF !~ /^main$/", &v));
        assert!(check("$REF =~ $RE", &v));
        // A value that is not /…/ is searched for the left side's value (String#scan).
        assert!(!check("$REF =~ $PLAIN", &v));
        assert!(check("$PLAIN =~ $REF", &v));
        assert!(check("$PLAIN =~ \"a release branch\"", &v));
        assert!(!check("$PLAIN !~ \"a release branch\"", &v));
        assert!(!check("$REF =~ \"a release branch\"", &v));
        // An unset left side is found in any string; nothing on the right matches nothing.
        assert!(check("$UNSET =~ \"feature\"", &v));
        assert!(!check("$UNSET !~ \"feature\"", &v));
        assert!(!check("$REF =~ $UNSET", &v));
        assert!(check("$REF !~ $UNSET", &v));
        // null is matched as the empty string.
        assert!(check("$UNSET =~ /^$/", &v));
        assert!(check("$UNSET !~ /x/", &v));
        assert!(check("$REF =~ /e/ && $REF =~ /2$/", &v));
    }

    #[test]
    fn precedence_and_parentheses() {
        let v = [("A", "1"), ("B", "1")];
        // && binds tighter: true || (false && false).
        assert!(check("$A == \"1\" || $X && $Y", &v));
        assert!(!check("($A == \"1\" || $X) && $Y", &v));
        assert!(check("($A && $B) || $C", &v));
        assert!(check("(($A))", &v));
    }

    #[test]
    fn errors_say_where() {
        for (bad, want) in [
            ("$A ==", "ends where a value"),
            ("$A = \"x\"", "unexpected \"=\" at column 4"),
            ("BRANCH == \"x\"", "unexpected \"BRANCH\" at column 1"),
            ("\"x", "unclosed string"),
            ("$A =~ /x", "unclosed pattern"),
            ("($A", "not closed"),
            ("$A == \"x\" \"y\"", "unexpected string \"y\" at column 11"),
            ("$A =~ /(/", "invalid regex"),
            ("$A =~ /x/q", "unknown regex flag"),
            ("", "empty expression"),
            ("$", "expected a variable name"),
            ("&& $A", "expected a value at column 1"),
        ] {
            let e = Expr::parse(bad).expect_err(bad);
            assert!(e.0.contains(want), "{bad}: {e}");
        }
        let deep = format!("{}$A{}", "(".repeat(40), ")".repeat(40));
        assert!(Expr::parse(&deep).is_err());
    }
}
