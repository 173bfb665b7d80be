use super::DomainError;

/// Character and length rules for a textual identifier.
#[derive(Debug, Clone, Copy)]
pub struct LabelRules {
    /// Maximum length in bytes (minimum is always 1).
    pub max_len: usize,
    /// Extra punctuation allowed besides ASCII letters and digits.
    pub punctuation: &'static str,
}

/// Checks a label against its rules: non-empty, not too long, allowed characters only, and
/// starting with a letter or digit.
pub fn validate_label(
    field: &'static str,
    value: &str,
    rules: LabelRules,
) -> Result<(), DomainError> {
    if value.is_empty() {
        return Err(DomainError::invalid(field, "must not be empty"));
    }
    if value.len() > rules.max_len {
        return Err(DomainError::invalid(
            field,
            format!(
                "{} bytes long, at most {} allowed",
                value.len(),
                rules.max_len
            ),
        ));
    }
    if let Some(c) = value
        .chars()
        .find(|c| !c.is_ascii_alphanumeric() && !rules.punctuation.contains(*c))
    {
        return Err(DomainError::invalid(
            field,
            format!(
                "character {c:?} not allowed (letters, digits and {:?} only)",
                rules.punctuation
            ),
        ));
    }
    if !value.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(DomainError::invalid(
            field,
            "must start with a letter or digit",
        ));
    }
    Ok(())
}
