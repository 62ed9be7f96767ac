-- record.lua: the key's record, laid out once for every script that reads
-- or writes one (each is built with this in front: RecordScript in
-- script.go). record.go is its twin in Go, and testdata/records in the
-- root holds a record of each state as the scripts write it.
--
-- A record is one string: a line of nine space-separated fields, then what
-- follows it. The fields: state (run, done, big, forgotten), fingerprint,
-- owner (the lock value of the executor; '!' before it once the executor
-- kept the key without an answer, keep.lua), fence, executions, the owner
-- and fence of the executor a takeover took the key from, '1' when the
-- store wrote a vanished record back, and the mark of the operator's
-- settle (settle.lua). No field holds a space: lock values are base64url,
-- the fingerprint is hex, the rest are words and numbers.
--
-- After the line, a finished record (done, big) has its answer: status,
-- the header block's length, a newline, the header block and the body. A
-- run's record has the journal of its steps instead (journal.go, step.lua),
-- which a takeover keeps and hands to the executor that resumes.

-- readRecord reads a record's line: its nine fields, and where what
-- follows the line starts. Nothing for text that is no record.
local function readRecord(text)
  return string.match(text, '^(%l+) ([^ ]*) ([^ ]*) (%d*) (%d*) ([^ ]*) (%d*) (%d*) ([^ \n]*)\n()')
end

-- recordLine writes a record's line from its nine fields, in readRecord's
-- order.
local function recordLine(state, fp, owner, fence, executions, prevOwner, prevFence, writtenBack, settled)
  return state .. ' ' .. fp .. ' ' .. owner .. ' ' .. fence .. ' ' .. executions .. ' ' .. prevOwner .. ' ' ..
    prevFence .. ' ' .. writtenBack .. ' ' .. settled .. '\n'
end

-- readAnswer reads the head of a finished record's answer, which starts at
-- at: its status, the header block's length, and where the header block
-- starts.
local function readAnswer(text, at)
  return string.match(text, '^(%d*) (%d+)\n()', at)
end

-- answerText writes an answer.
local function answerText(status, header, body)
  return status .. ' ' .. #header .. '\n' .. header .. body
end

