// Command fiber serves the side-by-side benchmark's trivial handler behind
// Fiber v3's idempotency middleware, with Fiber's Redis storage. Only the
// key header and its validator differ from the middleware as shipped: the
// header is the one the other servers read, and the shipped validator
// accepts nothing but 36-byte keys (UUIDs), which the load's keys are not.
package main

import (
	"fmt"
	"log"
	"time"

	"github.com/gofiber/fiber/v3"
	"github.com/gofiber/fiber/v3/middleware/idempotency"
	"github.com/gofiber/storage/redis/v3"
	"github.com/onceonly/idempotency/bench/peers/peer"
)

func main() {
	f := peer.ParseFlags(true)
	store := redis.New(redis.Config{Host: f.RedisHost, Port: f.RedisPort, PoolSize: 64})
	defer store.Close()

	app := fiber.New()
	// Counts every answer, as the net/http servers do; the middleware
	// marks a replay in the request's locals.
	app.Use(func(c fiber.Ctx) error {
		err := c.Next()
		status := c.Response().StatusCode()
		if err != nil {
			status = fiber.StatusInternalServerError
		}
		if c.Path() == peer.Path {
			peer.Answered(status, idempotency.IsFromCache(c))
		}
		return err
	})
	app.Use(idempotency.New(idempotency.Config{
		Storage:   store,
		KeyHeader: "Idempotency-Key",
		KeyHeaderValidate: func(k string) error {
			if len(k) < 1 || len(k) > 255 {
				return fmt.Errorf("%w: length %d is not in [1, 255]", idempotency.ErrInvalidIdempotencyKey, len(k))
			}
			return nil
		},
	}))
	app.Post(peer.Path, func(c fiber.Ctx) error {
		body := peer.Execute(f.Instance)
		c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
		return c.Status(fiber.StatusCreated).Send(body)
	})
	app.Get(peer.StatsPath, func(c fiber.Ctx) error {
		c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
		return c.Send(peer.StatsJSON())
	})
	time.AfterFunc(f.Lifetime, func() { app.ShutdownWithTimeout(time.Second) })
	if err := app.Listen(f.Addr, fiber.ListenConfig{DisableStartupMessage: true}); err != nil {
		log.Fatal(err)
	}
}
