//! rpull
