// Package faultcheck is the fault checker (its tests): randomized
// histories of requests against two server processes and one store, a
// private Redis (TestFaultCheck, TestFaultCheckSteps) or an SQL database
// (TestFaultCheckSQL, TestFaultCheckStepsSQL: SQLite always, PostgreSQL and MariaDB/MySQL when
// POSTGRES_DSN and MYSQL_DSN accept a connection), with faults injected at
// random moments, each history then held to the promises of the
// middleware. docs/reliability.md describes it; scripts/mutants.sh proves
// it. It is a module of its own so that the database drivers never enter
// the module graph of a program that imports the library.
package faultcheck
