-- A volume's files are on one node's disk: `node` names it, and only it serves them and runs
-- the sandboxes that mount the volume. Rows from before are '' until the node that opens the
-- database first claims them (one box: the only node).
ALTER TABLE volumes ADD COLUMN node TEXT NOT NULL DEFAULT '';
