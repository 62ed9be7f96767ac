// Package servertest holds sqlidem's tests against real servers: Redis, and
// SQLite, PostgreSQL and MySQL/MariaDB through their drivers. It is a
// module of its own so that the drivers the tests need never enter the
// module graph of a program that imports sqlidem, which needs
// database/sql alone.
package servertest
