package main

import (
	"errors"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// startEmbeddedNATS runs a JetStream-enabled NATS server inside this
// process, on a random loopback port, storing its streams in storeDir: the
// relay's no-set-up mode and the tests' broker. Shut it down with Shutdown
// and WaitForShutdown.
func startEmbeddedNATS(storeDir string) (*server.Server, error) {
	ns, err := server.NewServer(&server.Options{
		Host:               "127.0.0.1",
		Port:               server.RANDOM_PORT,
		JetStream:          true,
		StoreDir:           storeDir,
		JetStreamMaxMemory: 64 << 20,
		JetStreamMaxStore:  1 << 30,
		NoLog:              true,
		NoSigs:             true,
	})
	if err != nil {
		return nil, err
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("embedded NATS server did not start within 10s")
	}
	return ns, nil
}
