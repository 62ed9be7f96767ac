package sqltest

import (
	"context"
	"database/sql"
	"database/sql/driver"
)

// OpenWrapped opens dsn with the driver registered as driverName, as
// sql.Open does, through the connector that wrap makes of the driver's
// own: a test sees, delays or times every new connection of the pool. A
// driver with no connector of its own gets one that calls its Open.
func OpenWrapped(driverName, dsn string, wrap func(driver.Connector) driver.Connector) (*sql.DB, error) {
	plain, err := sql.Open(driverName, dsn) // connects nothing: it names the driver
	if err != nil {
		return nil, err
	}
	drv := plain.Driver()
	plain.Close()
	var c driver.Connector = dsnConnector{drv: drv, dsn: dsn}
	if dc, ok := drv.(driver.DriverContext); ok {
		if c, err = dc.OpenConnector(dsn); err != nil {
			return nil, err
		}
	}
	return sql.OpenDB(wrap(c)), nil
}

// A dsnConnector opens a driver's connections by its Open, as sql.Open
// does for a driver without a connector.
type dsnConnector struct {
	drv driver.Driver
	dsn string
}

func (c dsnConnector) Connect(context.Context) (driver.Conn, error) { return c.drv.Open(c.dsn) }
func (c dsnConnector) Driver() driver.Driver                        { return c.drv }
