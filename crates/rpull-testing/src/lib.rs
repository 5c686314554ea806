//! rpull-testing
