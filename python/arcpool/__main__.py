"""python3 -m arcpool: prints the version and the driver arcpool would use (device 0)."""
import arcpool


def main():
    version = arcpool.VERSION
    print(f"arcpool {version // 10000}.{version // 100 % 100}.{version % 100}: "
          f"driver {arcpool.DRIVER} (device 0)")


if __name__ == "__main__":
    main()
