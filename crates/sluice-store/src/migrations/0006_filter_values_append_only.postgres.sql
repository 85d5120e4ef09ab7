-- Filter values become an append-only list per set, and membership moves to memory; see the
-- SQLite script for why. The identity sequence keeps handing out seqs; the membership key
-- goes, and the listing's index becomes the primary key `(set_id, seq)`.
ALTER TABLE filter_sets ADD COLUMN version BIGINT NOT NULL DEFAULT 0;
ALTER TABLE filter_values DROP CONSTRAINT filter_values_member_pkey;
DROP INDEX filter_values_page;
ALTER TABLE filter_values ADD CONSTRAINT filter_values_pkey PRIMARY KEY (set_id, seq);
