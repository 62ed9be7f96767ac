// Package sqlstoretest runs the middleware on SQL (idempotency.NewSQL):
// the store conformance kit (package storetest) and the SQL store's own
// tests, on SQLite always and on PostgreSQL and MariaDB/MySQL when they
// accept POSTGRES_DSN and MYSQL_DSN. It is a module of its own so that the
// database drivers never enter the module graph of a program that imports
// the library.
package sqlstoretest
