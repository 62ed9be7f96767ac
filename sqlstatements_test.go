package idempotency

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/onceonly/idempotency/sqldialect"
)

// The index keeps the name it has always had while that fits, so a
// deployed table is not indexed twice; a longer one fits the limit and
// stays apart from another long name with the same beginning.
func TestIndexNameFitsEveryDatabase(t *testing.T) {
	assert.Equal(t, "idempotency_keys_until", indexName(sqldialect.PostgreSQL, "idempotency_keys"))
	assert.Equal(t, "shop_idempotency_keys_until", indexName(sqldialect.PostgreSQL, "shop.idempotency_keys"))

	long := strings.Repeat("a", 63)
	for _, table := range []string{long, long + "." + long, strings.Repeat("b", 57), strings.Repeat("b", 58)} {
		assert.LessOrEqual(t, len(indexName(sqldialect.PostgreSQL, table)), 63, table)
		assert.True(t, strings.HasSuffix(indexName(sqldialect.PostgreSQL, table), "_until"), table)
	}
	assert.Equal(t, strings.Repeat("b", 57)+"_until", indexName(sqldialect.PostgreSQL, strings.Repeat("b", 57)))
	assert.NotEqual(t, indexName(sqldialect.MySQL, long), indexName(sqldialect.MySQL, long[:62]+"z"))
	assert.Equal(t, long+"_until", indexName(sqldialect.SQLite, long), "SQLite has no limit, and a deployed index keeps its name")
}
