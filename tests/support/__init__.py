"""What tests share: references, the app under AppTest, a browser page, rounding bounds, inputs (docs/tests.md)."""
