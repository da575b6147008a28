-- Builds of one template in the order they were requested, on both databases (SQLite's rowid
-- did this; PostgreSQL has none): each new build gets its template's highest seq plus one.
-- Builds from before keep 0 and are ordered by when they were made, as they were.
ALTER TABLE template_builds ADD COLUMN seq BIGINT NOT NULL DEFAULT 0;
