//! rpull-extract
