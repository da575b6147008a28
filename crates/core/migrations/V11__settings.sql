-- Values the whole state shares, by name: the store's identity (which object storage bucket is
-- its own) and when object storage was last collected (once a day, by one node).
CREATE TABLE IF NOT EXISTS settings (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
